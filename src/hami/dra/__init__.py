"""DRA mode: ResourceSlices, the kubelet DRA plugin and the webhook translation."""
