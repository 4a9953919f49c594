"""``hami device-plugin``: the kubelet device plugin (HAMi-core 1.2)."""
