"""Node-side monitor components (vGPU monitor). ``region`` reads libvgpu's shared region."""
