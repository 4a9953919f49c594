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
devices.vendors; resources also name every resource*Name the config sets. A vendor is enabled when devices.vendors.<section>.enabled is true and
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
{{- range $key, $value := $config }}
{{- if and (hasPrefix "resource" $key) (kindIs "string" $value) }}
{{- $resources = append $resources $value -}}
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

{{/* Keys of a HAMi values file that this chart does not use, each with the reason, as a
JSON list of "key: reason" (NOTES.txt lists them). Keys the chart does not define are
listed when present; global.imageTag, HAMi's image repository and a few HAMi values with
no counterpart are listed when set. */}}
{{- define "hami.ignoredHamiKeys" -}}
{{- $certJob := "certificates come from the scheduler pod's init container (hami certgen), not a Job" -}}
{{- $nvdp := "an NVIDIA device-plugin option hami's device plugin does not have" -}}
{{- $ascendPlugin := "the chart does not install Ascend's device plugin" -}}
{{- $old := "a key of older HAMi charts" -}}
{{- $reasons := dict
  "podSecurityPolicy" "PodSecurityPolicy is gone since Kubernetes 1.25"
  "mockDevicePlugin" "hami has no mock device plugin"
  "hami-dra" "DRA mode is built in: set dra.enabled"
  "platform" "no OpenShift objects are rendered"
  "imagePullSecrets" "use global.imagePullSecrets"
  "version" $old
  "global.managedNodeSelectorEnable" "use devicePlugin.nvidiaNodeSelector and scheduler.nodeSelector"
  "global.managedNodeSelector" "use devicePlugin.nvidiaNodeSelector and scheduler.nodeSelector"
  "scheduler.kubeQPS" "hami's API client is not rate limited"
  "scheduler.kubeBurst" "hami's API client is not rate limited"
  "scheduler.kubeScheduler.extraArgs" "the pre-1.22 Policy file; extraNewArgs is used"
  "scheduler.kubeScheduler.imagePullPolicy" "use scheduler.kubeScheduler.image.pullPolicy"
  "scheduler.extender.imagePullPolicy" "use scheduler.extender.image.pullPolicy"
  "scheduler.admissionWebhook.objectSelector" "pods are selected by namespace only"
  "scheduler.patch.image" $certJob
  "scheduler.patch.imageNew" $certJob
  "scheduler.patch.imagePullPolicy" $certJob
  "scheduler.patch.priorityClassName" $certJob
  "scheduler.patch.podAnnotations" $certJob
  "scheduler.patch.nodeSelector" $certJob
  "scheduler.patch.tolerations" $certJob
  "scheduler.patch.runAsUser" $certJob
  "scheduler.service.monitorTargetPort" "follows scheduler.metricsBindAddress"
  "scheduler.service.httpTargetPort" "follows scheduler.httpPort"
  "scheduler.customWebhook" "use scheduler.admissionWebhook.customURL"
  "scheduler.mutatingWebhookConfiguration" "use scheduler.admissionWebhook.failurePolicy"
  "scheduler.defaultMem" "use devices.nvidia.defaultMemory"
  "scheduler.defaultCores" "use devices.nvidia.defaultCores"
  "scheduler.defaultGPUNum" "use devices.nvidia.defaultGPUNum"
  "devicePlugin.imagePullPolicy" "use devicePlugin.image.pullPolicy"
  "devicePlugin.monitor.image" "the monitor runs from devicePlugin.image"
  "devicePlugin.monitorimage" "the monitor runs from devicePlugin.image"
  "devicePlugin.monitorctrPath" "use devicePlugin.monitor.ctrPath"
  "devicePlugin.nvidianodeSelector" "use devicePlugin.nvidiaNodeSelector"
  "devicePlugin.vgpuMonitor" "use devicePlugin.monitor.resources"
  "devicePlugin.gpuOperatorToolkitReady" "the device plugin does not wait for the GPU Operator's validations"
  "devicePlugin.migStrategy" "set migstrategy per node in devicePlugin.nodeConfiguration"
  "devicePlugin.passDeviceSpecsEnabled" $nvdp
  "devicePlugin.deviceListStrategy" $nvdp
  "devicePlugin.nvidiaHookPath" $nvdp
  "devicePlugin.nvidiaDriverRoot" $nvdp
  "devicePlugin.gdrcopyEnabled" $nvdp
  "devicePlugin.gdsEnabled" $nvdp
  "devicePlugin.mofedEnabled" $nvdp
  "devicePlugin.numaRefit" $nvdp
  "devicePlugin.hostPIDBroker" $nvdp
  "devicePlugin.selinux" $nvdp
  "devices.ascend.image" $ascendPlugin
  "devices.ascend.imagePullPolicy" $ascendPlugin
  "devices.ascend.extraArgs" $ascendPlugin
  "devices.ascend.nodeSelector" $ascendPlugin
  "devices.ascend.tolerations" $ascendPlugin
  "devices.ascend.resources" $ascendPlugin
  "iluvatarResourceName" "set per chip in devices.iluvatar.configs"
  "iluvatarResourceMem" "set per chip in devices.iluvatar.configs"
  "iluvatarResourceCore" "set per chip in devices.iluvatar.configs"
  "enflameResourceNameDRSGCU" "hami's Enflame support has no DRS profiles"
  "enflameResourceNameGCUMemory" "hami's Enflame support has no DRS profiles"
  "enflameResourceNameGCUCore" "hami's Enflame support has no DRS profiles"
-}}
{{- $out := list -}}
{{- range $path, $reason := $reasons }}
{{- $node := $.Values -}}
{{- $found := true -}}
{{- range splitList "." $path }}
{{- if and $found (kindIs "map" $node) (hasKey $node .) }}
{{- $node = index $node . -}}
{{- else }}
{{- $found = false -}}
{{- end }}
{{- end }}
{{- if $found }}
{{- $out = append $out (printf "%s: %s" $path $reason) -}}
{{- end }}
{{- end }}
{{- with .Values.global.imageTag }}
{{- $out = append $out (printf "global.imageTag=%v: a HAMi release tag; the hami images use global.hamiImageTag, else %s" . $.Chart.AppVersion) -}}
{{- end }}
{{- range $path, $img := dict "scheduler.extender.image" .Values.scheduler.extender.image "devicePlugin.image" .Values.devicePlugin.image }}
{{- if include "hami.isHamiGoImage" ($img.repository | default "" | toString) }}
{{- $out = append $out (printf "%s.repository=%s: HAMi's image, which cannot run hami; hami's own image is used" $path $img.repository) -}}
{{- end }}
{{- end }}
{{- with .Values.devices.ascend }}
{{- if .hamiVnpuCore }}
{{- $out = append $out "devices.ascend.hamiVnpuCore: annotate each soft-partitioned node with hami-vnpu-core=true instead" -}}
{{- end }}
{{- if .runtimeClassName }}
{{- $out = append $out "devices.ascend.runtimeClassName: the webhook sets no RuntimeClass on Ascend pods" -}}
{{- end }}
{{- end }}
{{- $out | sortAlpha | toJson -}}
{{- end -}}
