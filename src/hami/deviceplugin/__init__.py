"""``hami device-plugin``: the kubelet device plugin (hami-core-spec §B)."""
