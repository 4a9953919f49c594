{{/* The other vendors' device-config sections, resources and annotation keys, from
devices.vendors, devices.ascend, devices.iluvatar and the keys a HAMi values file uses for
the same things (HAMi's top-level <vendor>Resource* names, devices.<vendor>.enabled and
devices.<vendor>.customresources). docs/vendors.md describes each vendor. */}}

{{/* HAMi's top-level resource-name keys and the device-config key each one sets, per
section. A key set in devices.vendors.<section>.config wins. */}}
{{- define "hami.hamiVendorKeys" -}}
{{- dict
  "cambricon" (dict "mluResourceName" "resourceCountName" "mluResourceMem" "resourceMemoryName" "mluResourceCores" "resourceCoreName")
  "hygon" (dict "dcuResourceName" "resourceCountName" "dcuResourceMem" "resourceMemoryName" "dcuResourceCores" "resourceCoreName")
  "metax" (dict "metaxResourceName" "resourceVCountName" "metaxResourceMem" "resourceVMemoryName" "metaxResourceCore" "resourceVCoreName" "metaxsGPUTopologyAware" "sgpuTopologyAware")
  "kunlun" (dict "kunlunResourceName" "resourceCountName" "kunlunResourceVCountName" "resourceVCountName" "kunlunResourceVMemoryName" "resourceVMemoryName")
  "enflame" (dict "enflameResourceNameVGCU" "resourceNameVGCU" "enflameResourceNameVGCUPercentage" "resourceNameVGCUPercentage")
  "vastai" (dict "vastaiResourceName" "resourceCountName")
  "biren" (dict "birenResourceName" "resourceCountName")
  | toJson -}}
{{- end -}}

{{/* JSON {section: {"config": {...}, "resources": [...]}} of the enabled vendors of
devices.vendors. A vendor is enabled when devices.vendors.<section>.enabled is true and
HAMi's devices.<section>.enabled, where a values file sets it, is true too. */}}
{{- define "hami.vendorSections" -}}
{{- $root := . -}}
{{- $hamiKeys := include "hami.hamiVendorKeys" . | fromJson -}}
{{- $out := dict -}}
{{- range $section, $v := .Values.devices.vendors }}
{{- $hami := index $root.Values.devices $section | default dict -}}
{{- if and $v.enabled (or (not (hasKey $hami "enabled")) $hami.enabled) }}
{{- $config := deepCopy ($v.config | default dict) -}}
{{- $resources := concat ($v.resources | default list) ($hami.customresources | default list) -}}
{{- range $top, $key := index $hamiKeys $section | default dict }}
{{- if and (hasKey $root.Values $top) (not (hasKey $config $key)) }}
{{- $value := index $root.Values $top -}}
{{- if eq $key "sgpuTopologyAware" }}
{{- $_ := set $config $key (eq (toString $value) "true") -}}
{{- else }}
{{- $_ := set $config $key (toString $value) -}}
{{- $resources = append $resources (toString $value) -}}
{{- end }}
{{- end }}
{{- end }}
{{- $_ := set $out $section (dict "config" $config "resources" ($resources | uniq)) -}}
{{- end }}
{{- end }}
{{- $out | toJson -}}
{{- end -}}

{{/* Resource names of the enabled Ascend and Iluvatar chips (their device-config
entries plus HAMi's devices.<vendor>.customresources), as a JSON list. */}}
{{- define "hami.chipResources" -}}
{{- $names := list -}}
{{- with .Values.devices.ascend }}
{{- if .enabled }}
{{- range .configs }}
{{- $word := .commonWord -}}
{{- $names = concat $names (list (.resourceName | default (printf "huawei.com/%s" $word)) (.resourceMemoryName | default (printf "huawei.com/%s-memory" $word))) -}}
{{- with .resourceCoreName }}{{ $names = append $names . }}{{ end -}}
{{- end }}
{{- $names = concat $names (.customresources | default list) -}}
{{- end }}
{{- end }}
{{- with .Values.devices.iluvatar }}
{{- if .enabled }}
{{- range .configs }}
{{- $chip := .chipName | default .commonWord -}}
{{- $names = concat $names (list (.resourceCountName | default (printf "iluvatar.ai/%s-vgpu" $chip)) (.resourceMemoryName | default (printf "iluvatar.ai/%s.vMem" $chip)) (.resourceCoreName | default (printf "iluvatar.ai/%s.vCore" $chip))) -}}
{{- end }}
{{- $names = concat $names (.customresources | default list) -}}
{{- end }}
{{- end }}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* Allocation annotation keys of the enabled Ascend and Iluvatar chips (JSON list):
hami.io/<CommonWord>-devices-allocated and -to-allocate. */}}
{{- define "hami.chipAllocationKeys" -}}
{{- $keys := list -}}
{{- if .Values.devices.ascend.enabled }}
{{- range .Values.devices.ascend.configs }}
{{- $keys = concat $keys (list (printf "hami.io/%s-devices-allocated" .commonWord) (printf "hami.io/%s-devices-to-allocate" .commonWord)) -}}
{{- end }}
{{- end }}
{{- if .Values.devices.iluvatar.enabled }}
{{- range .Values.devices.iluvatar.configs }}
{{- $word := .commonWord | default .chipName -}}
{{- $keys = concat $keys (list (printf "hami.io/%s-devices-allocated" $word) (printf "hami.io/%s-devices-to-allocate" $word)) -}}
{{- end }}
{{- end }}
{{- $keys | toJson -}}
{{- end -}}
