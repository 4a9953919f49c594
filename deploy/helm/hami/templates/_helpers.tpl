{{/* Chart name, truncated to the 63 characters DNS labels allow. */}}
{{- define "hami.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name: release name, plus the chart name unless already in it. */}}
{{- define "hami.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "hami.allocationKeySecret" -}}
{{- printf "%s-allocation-key" (include "hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami.scheduler" -}}
{{- printf "%s-scheduler" (include "hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami.device-plugin" -}}
{{- printf "%s-device-plugin" (include "hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami.scheduler.tls" -}}
{{- printf "%s-scheduler-tls" (include "hami.fullname" .) -}}
{{- end -}}

{{- define "hami.scheduler.webhook" -}}
{{- printf "%s-webhook" (include "hami.scheduler" .) -}}
{{- end -}}

{{- define "hami.scheduler.serviceAccountName" -}}
{{- default (include "hami.scheduler" .) .Values.scheduler.serviceAccountName -}}
{{- end -}}

{{/* kube-scheduler's own ServiceAccount (not the hami scheduler's: kube-scheduler's
built-in role deletes pods, the hami scheduler's may not). */}}
{{- define "hami.kubeScheduler.serviceAccountName" -}}
{{- default (printf "%s-kube-scheduler" (include "hami.fullname" .) | trunc 63 | trimSuffix "-") .Values.scheduler.kubeScheduler.serviceAccountName -}}
{{- end -}}

{{/* The Secret holding kube-scheduler's ServiceAccount token. */}}
{{- define "hami.kubeScheduler.tokenSecret" -}}
{{- printf "%s-kube-scheduler-token" (include "hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Kubernetes user names of hami's two ServiceAccounts (admission policies). */}}
{{- define "hami.scheduler.user" -}}
{{- printf "system:serviceaccount:%s:%s" (include "hami.namespace" .) (include "hami.scheduler.serviceAccountName" .) -}}
{{- end -}}

{{- define "hami.device-plugin.user" -}}
{{- printf "system:serviceaccount:%s:%s" (include "hami.namespace" .) (include "hami.device-plugin.serviceAccountName" .) -}}
{{- end -}}

{{- define "hami.device-plugin.serviceAccountName" -}}
{{- default (include "hami.device-plugin" .) .Values.devicePlugin.serviceAccountName -}}
{{- end -}}

{{/* DRA mode's node agent (hami dra-plugin + the monitor). */}}
{{- define "hami.dra-plugin" -}}
{{- printf "%s-dra-plugin" (include "hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami.dra-plugin.serviceAccountName" -}}
{{- default (include "hami.dra-plugin" .) .Values.dra.serviceAccountName -}}
{{- end -}}

{{/* Fails unless the DRA plugin's and the device plugin's node selectors exclude each
other (some label key in both with different values), when both DaemonSets are on: a
card managed by both would be booked twice. */}}
{{- define "hami.dra.checkNodes" -}}
{{- if and .Values.dra.enabled .Values.devicePlugin.enabled -}}
{{- $dp := .Values.devicePlugin.nvidiaNodeSelector | default dict -}}
{{- $dra := .Values.dra.nodeSelector | default dict -}}
{{- $apart := false -}}
{{- range $k, $v := $dra -}}
{{- if and (hasKey $dp $k) (ne (toString (get $dp $k)) (toString $v)) -}}
{{- $apart = true -}}
{{- end -}}
{{- end -}}
{{- if not $apart -}}
{{- fail (printf "dra.enabled and devicePlugin.enabled: dra.nodeSelector (%s) and devicePlugin.nvidiaNodeSelector (%s) could select the same node, and a card managed by both the device plugin and the DRA plugin would be booked twice. Give both selectors one label key with different values (e.g. gpu: \"on\" and gpu: \"dra\"), or set devicePlugin.enabled=false" (toJson $dra) (toJson $dp)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "hami.labels" -}}
helm.sh/chart: {{ include "hami.chart" . }}
{{ include "hami.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "hami.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hami.annotations" -}}
{{- with .Values.global.annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Image of a hami container: [<registry>/]<repository>:<tag>, the names `make images
REGISTRY=<registry> TAG=<tag>` builds. Arguments: (list $ <image values> <default repository>).
- registry: global.imageRegistry, else the image's own registry, else none;
- repository: the image's own, except HAMi's image (projecthami/hami, set by a HAMi values
  file), which cannot run hami: then the default repository;
- tag: the image's own (not with HAMi's repository), else global.hamiImageTag, else the
  chart's appVersion. HAMi's global.imageTag names a HAMi release (v2.10.0) and is not used:
  no hami image carries HAMi's version. */}}
{{- define "hami.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $repo := $img.repository | default "" | toString -}}
{{- $tag := $img.tag | default "" | toString | trim -}}
{{- $registry := $img.registry | default "" | toString -}}
{{- if or (not $repo) (include "hami.isHamiGoImage" $repo) -}}
{{- $repo = index . 2 -}}
{{- $tag = "" -}}
{{- /* the registry given for HAMi's Go image (docker.io in HAMi's values) is not one
that serves hami's images */ -}}
{{- $registry = "" -}}
{{- end -}}
{{- $tag = $tag | default ($root.Values.global.hamiImageTag | default "" | toString | trim) | default $root.Chart.AppVersion -}}
{{- /* No registry: hami.invalid, a name no registry serves (RFC 6761), never a public
registry's namespace this project does not own (hami/... alone means Docker Hub). */ -}}
{{- $registry = default $registry $root.Values.global.imageRegistry | default "hami.invalid" -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) $repo $tag -}}
{{- end -}}

{{/* Non-empty when a repository is HAMi's Go image (projecthami/hami, any registry). */}}
{{- define "hami.isHamiGoImage" -}}
{{- if or (eq . "projecthami/hami") (hasSuffix "/projecthami/hami" .) -}}true{{- end -}}
{{- end -}}

{{/* kube-scheduler image; the tag: image.tag, else HAMi's older scheduler.kubeScheduler.imageTag,
else the cluster's version (vX.Y.Z). global.imageRegistry applies here too (mirror it). */}}
{{- define "hami.kubeScheduler.image" -}}
{{- $ks := .Values.scheduler.kubeScheduler -}}
{{- $img := $ks.image -}}
{{- $tag := $img.tag | default ($ks.imageTag | default "" | toString | trim) | default (regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version) -}}
{{- $registry := default $img.registry .Values.global.imageRegistry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) $img.repository $tag -}}
{{- end -}}

{{- define "hami.imagePullSecrets" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $secrets := concat ($root.Values.global.imagePullSecrets | default list) ($img.pullSecrets | default list) | uniq -}}
{{- with $secrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The resources kube-scheduler leaves to the extender (ignoredByScheduler, as HAMi's
chart does): NVIDIA's and those of every enabled vendor. */}}
{{- define "hami.managedResources" -}}
{{- $names := list .Values.resourceName .Values.resourceMem .Values.resourceMemPercentage .Values.resourceCores .Values.resourcePriority -}}
{{- range $section, $v := include "hami.vendorSections" . | fromJson }}
{{- $names = concat $names $v.resources -}}
{{- end }}
{{- $names = concat $names (include "hami.chipResources" . | fromJsonArray) -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* URL prefix kube-scheduler calls: the hami scheduler in the same pod. */}}
{{- define "hami.extenderURL" -}}
{{- if .Values.scheduler.extenderLoopbackPort -}}
{{- printf "http://127.0.0.1:%v" .Values.scheduler.extenderLoopbackPort -}}
{{- else -}}
{{- printf "https://127.0.0.1:%v" .Values.scheduler.httpPort -}}
{{- end -}}
{{- end -}}

{{/* The KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) registering hami. */}}
{{- define "hami.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: {{ .Values.scheduler.leaderElect }}
  {{- if .Values.scheduler.leaderElect }}
  resourceName: {{ .Values.schedulerName }}
  resourceNamespace: {{ include "hami.namespace" . }}
  {{- end }}
clientConnection:
  qps: {{ .Values.scheduler.kubeScheduler.clientQPS }}
  burst: {{ .Values.scheduler.kubeScheduler.clientBurst }}
profiles:
  - schedulerName: {{ .Values.schedulerName }}
extenders:
  - urlPrefix: {{ include "hami.extenderURL" . }}
    {{- if .Values.dra.enabled }}
    {{- /* DRA mode: kube-scheduler's DynamicResources plugin allocates the claims; hami
    only ranks the feasible nodes (no filter, no bind, no node lock). */}}
    prioritizeVerb: prioritize
    {{- else }}
    filterVerb: filter
    bindVerb: bind
    {{- if .Values.scheduler.preemption.enabled }}
    {{- /* kube-scheduler's own preemption dry run: hami swaps its victims for those
    that free the right card, or drops the node (docs/priority-preemption.md). */}}
    preemptVerb: preempt
    {{- end }}
    {{- end }}
    nodeCacheCapable: true
    weight: 1
    httpTimeout: {{ printf "%vs" .Values.scheduler.extenderHTTPTimeout }}
    {{- if .Values.scheduler.extenderLoopbackPort }}
    enableHTTPS: false
    {{- else }}
    enableHTTPS: true
    tlsConfig:
      insecure: true
    {{- end }}
    {{- if .Values.dra.enabled }}
    managedResources: []
    {{- else }}
    managedResources:
      {{- range (include "hami.managedResources" . | fromJsonArray) }}
      - name: {{ . }}
        ignoredByScheduler: true
      {{- end }}
    {{- end }}
{{- end -}}

{{/* device-config.yaml (HAMi's device config): the nvidia section and one per enabled
vendor (_vendors.tpl). */}}
{{- define "hami.deviceConfig" -}}
{{- if (index .Values "device-config" "content") -}}
{{ index .Values "device-config" "content" }}
{{- else -}}
nvidia:
  resourceCountName: {{ .Values.resourceName }}
  resourceMemoryName: {{ .Values.resourceMem }}
  resourceMemoryPercentageName: {{ .Values.resourceMemPercentage }}
  resourceCoreName: {{ .Values.resourceCores }}
  resourcePriorityName: {{ .Values.resourcePriority }}
  overwriteEnv: {{ .Values.scheduler.overwriteEnv | toString | eq "true" }}
  defaultMemory: {{ .Values.devices.nvidia.defaultMemory | int }}
  defaultCores: {{ .Values.devices.nvidia.defaultCores | int }}
  defaultGPUNum: {{ .Values.devices.nvidia.defaultGPUNum | int }}
  memoryFactor: {{ .Values.devices.nvidia.memoryFactor | int }}
  deviceSplitCount: {{ .Values.devicePlugin.deviceSplitCount | int }}
  deviceMemoryScaling: {{ .Values.devicePlugin.deviceMemoryScaling }}
  deviceCoreScaling: {{ .Values.devicePlugin.deviceCoreScaling }}
  preConfiguredDeviceMemory: {{ .Values.devicePlugin.preConfiguredDeviceMemory | int }}
  enableNumaTopology: {{ .Values.devicePlugin.enableNumaTopology }}
  disableCoreLimit: {{ .Values.devicePlugin.disablecorelimit | toString | eq "true" }}
  libCudaLogLevel: {{ .Values.devices.nvidia.libCudaLogLevel | quote }}
  gpuCorePolicy: {{ .Values.devices.nvidia.gpuCorePolicy }}
  runtimeClassName: {{ .Values.devicePlugin.runtimeClassName | quote }}
  {{- with .Values.devices.nvidia.migProfileAllowlist }}
  migProfileAllowlist:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- range $section, $v := include "hami.vendorSections" . | fromJson }}
{{ $section }}: {{ toYaml $v.config | nindent 2 }}
{{- end }}
{{- if .Values.devices.iluvatar.enabled }}
iluvatars: {{ toYaml .Values.devices.iluvatar.configs | nindent 2 }}
{{- end }}
{{- if .Values.devices.ascend.enabled }}
vnpus:
  configs: {{ toYaml .Values.devices.ascend.configs | nindent 4 }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The Lease the hami scheduler follows: kube-scheduler's own (named after the profile).
The hami process leads iff that Lease's holder is its pod, so the active kube-scheduler
always calls a leading extender in its own pod (HAMi's rule: lead iff the kube-scheduler
Lease's holder is this host). */}}
{{- define "hami.extenderLease" -}}
{{- .Values.schedulerName -}}
{{- end -}}

{{/* Every pod annotation that carries an allocation or its progress, as a JSON list: HAMi's
NVIDIA keys and the allocated / to-allocate keys of each vendor the device config enables
(the vendors enabled under devices.vendors, devices.ascend and devices.iluvatar, or the
sections of device-config.content),
plus admissionPolicy.extraAllocationKeys. The hami scheduler derives the same list from
the device config it reads (hami.core.provenance.allocation_keys); a test compares them. */}}
{{- define "hami.allocationKeys" -}}
{{- $vendorKeys := dict
  "amd" (list "hami.io/amd-devices-allocated" "hami.io/amd-devices-to-allocate")
  "awsneuron" (list "hami.io/aws-neuron-devices-allocated")
  "biren" (list "hami.io/Biren-devices-allocated" "hami.io/Biren-devices-to-allocate")
  "cambricon" (list "hami.io/cambricon-mlu-devices-allocated" "hami.io/cambricon-mlu-devices-to-allocate")
  "enflame" (list "hami.io/enflame-gcu-devices-allocated" "hami.io/enflame-gcu-devices-to-allocate" "hami.io/enflame-vgpu-devices-allocated")
  "hygon" (list "hami.io/dcu-devices-allocated" "hami.io/dcu-devices-to-allocate")
  "kunlun" (list "hami.io/kunlun-allocated" "hami.io/xpu-devices-allocated" "hami.io/xpu-devices-to-allocate")
  "metax" (list "hami.io/metax-gpu-devices-allocated" "hami.io/metax-gpu-devices-to-allocate" "hami.io/metax-sgpu-devices-allocated" "hami.io/metax-sgpu-devices-to-allocate")
  "mthreads" (list "hami.io/mthreads-vgpu-devices-allocated")
  "vastai" (list "hami.io/Vastai-devices-allocated" "hami.io/Vastai-devices-to-allocate")
-}}
{{- $keys := list "hami.io/vgpu-node" "hami.io/vgpu-time" "hami.io/vgpu-devices-to-allocate" "hami.io/vgpu-devices-allocated" "hami.io/vgpu-mig-allocations" "hami.io/bind-phase" "hami.io/bind-time" "hami.io/vgpu-allocation-signature" -}}
{{- $content := index .Values "device-config" "content" -}}
{{- if $content -}}
{{- $doc := fromYaml $content -}}
{{- range $section, $v := $doc }}
{{- if and (hasKey $vendorKeys $section) (not (kindIs "invalid" $v)) }}
{{- $keys = concat $keys (index $vendorKeys $section) -}}
{{- end }}
{{- end }}
{{- if and .Values.devices.ascend.enabled (kindIs "map" $doc.vnpus) }}
{{- range $doc.vnpus.configs | default list }}
{{- $keys = concat $keys (list (printf "hami.io/%s-devices-allocated" .commonWord) (printf "hami.io/%s-devices-to-allocate" .commonWord)) -}}
{{- end }}
{{- end }}
{{- if .Values.devices.iluvatar.enabled }}
{{- range $doc.iluvatars | default list }}
{{- $word := .commonWord | default .chipName -}}
{{- $keys = concat $keys (list (printf "hami.io/%s-devices-allocated" $word) (printf "hami.io/%s-devices-to-allocate" $word)) -}}
{{- end }}
{{- end }}
{{- else -}}
{{- range $section, $v := include "hami.vendorSections" . | fromJson }}
{{- if hasKey $vendorKeys $section }}
{{- $keys = concat $keys (index $vendorKeys $section) -}}
{{- end }}
{{- end }}
{{- $keys = concat $keys (include "hami.chipAllocationKeys" . | fromJsonArray) -}}
{{- end -}}
{{- $keys = concat $keys (.Values.admissionPolicy.extraAllocationKeys | default list) -}}
{{- $keys | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/*
"true" where .Capabilities.APIVersions lists kinds (group/version/Kind): helm install and
upgrade read them from the API server's discovery; `helm template` knows only helm's
built-in group/versions (no kinds), and then the server version decides.
*/}}
{{- define "hami.capabilities.fromServer" -}}
{{- if .Capabilities.APIVersions.Has "v1/Pod" -}}true{{- end -}}
{{- end -}}

{{/*
"true" where the cluster serves ValidatingAdmissionPolicy in admissionregistration.k8s.io/v1
(GA in Kubernetes 1.30), else "".
*/}}
{{- define "hami.vap.served" -}}
{{- if include "hami.capabilities.fromServer" . -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}true{{- end -}}
{{- else if semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version -}}
true
{{- end -}}
{{- end -}}

{{/*
DRA mode needs resource.k8s.io/v1 (GA in Kubernetes 1.34); refuse to render it elsewhere,
in one line, instead of failing at the first DeviceClass or claim.
*/}}
{{- define "hami.dra.checkServer" -}}
{{- if .Values.dra.enabled -}}
{{- $served := false -}}
{{- if include "hami.capabilities.fromServer" . -}}
{{- $served = .Capabilities.APIVersions.Has "resource.k8s.io/v1/DeviceClass" -}}
{{- else -}}
{{- $served = and (.Capabilities.APIVersions.Has "resource.k8s.io/v1") (semverCompare ">=1.34-0" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if not $served -}}
{{- fail (printf "dra.enabled: DRA mode needs resource.k8s.io/v1 (Kubernetes 1.34 or later, consumable capacity on: 1.36 or later by default); this cluster (%s) does not serve it. Set dra.enabled=false (extender mode)" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}
{{- end -}}
