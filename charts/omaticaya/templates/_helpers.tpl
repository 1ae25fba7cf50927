{{/* Chart name, truncated to 63 characters (DNS label). */}}
{{- define "omaticaya.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name, truncated to 63 characters. If the release name already contains the
chart name it is used as is.
*/}}
{{- define "omaticaya.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "omaticaya.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "omaticaya.labels" -}}
helm.sh/chart: {{ include "omaticaya.chart" . }}
{{ include "omaticaya.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-agent
{{- end }}

{{/* Selector labels (immutable on the DaemonSet: never add to these). */}}
{{- define "omaticaya.selectorLabels" -}}
app.kubernetes.io/name: {{ include "omaticaya.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of the uninstall hook's objects (not the agent's selector: its pod is no agent). */}}
{{- define "omaticaya.hookLabels" -}}
helm.sh/chart: {{ include "omaticaya.chart" . }}
app.kubernetes.io/name: {{ printf "%s-uninstall" (include "omaticaya.name" . | trunc 53 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: uninstall-hook
{{- end }}

{{/* Name of the ServiceAccount to use. */}}
{{- define "omaticaya.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "omaticaya.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Container image reference. */}}
{{- define "omaticaya.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{/* The label/annotation key prefix without a trailing slash. */}}
{{- define "omaticaya.prefix" -}}
{{- .Values.prefix | trimSuffix "/" }}
{{- end }}

{{/* True ("true") when the metrics Service is rendered. */}}
{{- define "omaticaya.serviceEnabled" -}}
{{- if and (gt (int64 .Values.metricsPort) 0) (or .Values.service.enabled .Values.serviceMonitor.enabled) }}true{{ end }}
{{- end }}

{{/* xidIgnore as a comma-separated string of integers: "13,31,43". */}}
{{- define "omaticaya.xidIgnore" -}}
{{- $xids := list }}
{{- range .Values.xidIgnore }}
{{- $xids = append $xids (int64 . | toString) }}
{{- end }}
{{- join "," $xids }}
{{- end }}

{{/*
The cluster's version as vMAJOR.MINOR.PATCH: a vendor suffix ("+k3s1", "-eks-a737599",
"-gke.1014001") is dropped and a missing patch (`helm template --kube-version 1.30`) is ".0".
*/}}
{{- define "omaticaya.kubeVersion" -}}
{{- $v := regexFind "^v?[0-9]+\\.[0-9]+(\\.[0-9]+)?" .Capabilities.KubeVersion.Version | trimPrefix "v" }}
{{- if not $v }}
{{- fail (printf "cannot read a Kubernetes version from %q" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if eq (len (splitList "." $v)) 2 }}{{ $v = printf "%s.0" $v }}{{ end }}
{{- printf "v%s" $v }}
{{- end }}

{{/*
The scheduler's KubeSchedulerConfiguration apiVersion: kubescheduler.config.k8s.io/v1, the one
every supported kube-scheduler (1.31 and later, Chart.yaml's kubeVersion) reads: v1 is served
from 1.25, v1beta1 went in 1.23, v1beta2 in 1.28, v1beta3 in 1.29 (k8s.io/kube-scheduler
config/<version>/types.go at tags v0.19.0 ... v0.37.2). scheduler.configApiVersion may name it;
any other version fails the render, as no supported kube-scheduler reads it.
*/}}
{{- define "omaticaya.schedulerConfigApiVersion" -}}
{{- $v1 := "kubescheduler.config.k8s.io/v1" }}
{{- $api := .Values.scheduler.configApiVersion | default $v1 }}
{{- if ne $api $v1 }}
{{- fail (printf "scheduler.configApiVersion %s is not read by kube-scheduler %s: every supported Kubernetes (1.31 and later) reads %s only; leave it empty" $api (include "omaticaya.kubeVersion" .) $v1) }}
{{- end }}
{{- $api }}
{{- end }}

{{/* The kube-scheduler image tag: scheduler.image.tag, or the cluster's own version. */}}
{{- define "omaticaya.schedulerImageTag" -}}
{{- .Values.scheduler.image.tag | default (include "omaticaya.kubeVersion" .) }}
{{- end }}

{{/*
The kube-scheduler version the scheduler pod runs, as vMAJOR.MINOR.PATCH: its image tag when that
reads as a version (scheduler.image.tag "v1.33.3"), else the cluster's. NOTES.txt names it.
*/}}
{{- define "omaticaya.schedulerVersion" -}}
{{- $tag := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" (include "omaticaya.schedulerImageTag" .) | trimPrefix "v" }}
{{- if $tag }}{{ printf "v%s" $tag }}{{ else }}{{ include "omaticaya.kubeVersion" . }}{{ end }}
{{- end }}

{{/*
"true" when the scheduler runs preemption (kube-scheduler's DefaultPreemption PostFilter and the
extender's preemptVerb): scheduler.preemption "auto" (the default) or "on". "auto" once turned it
off below kube-scheduler 1.22 (1.20/1.21 releases without the fix of kubernetes#102971 never call
the extender on preemption and can panic, kubernetes#101548); every supported kube-scheduler
(1.31 and later) has the fix, so "auto" is "on". "off": the profile's PostFilter plugins disabled
and no preemptVerb.
*/}}
{{- define "omaticaya.schedulerPreemption" -}}
{{- if ne (toString .Values.scheduler.preemption) "off" }}true{{ end }}
{{- end }}

{{/*
The pods' PriorityClass: priorityClassName, else system-node-critical when the pod is the node's
device plugin or DRA driver (the kubelet must not evict what serves its GPUs), else none.
*/}}
{{- define "omaticaya.priorityClassName" -}}
{{- .Values.priorityClassName | default (ternary "system-node-critical" "" (or (eq (toString .Values.devicePlugin) "true") (eq (include "omaticaya.dra" .) "true"))) }}
{{- end }}

{{/*
"true" when the admission policies are rendered. validatingAdmissionPolicy.enabled "auto" (the
default): on, as every supported Kubernetes (1.31 and later) serves admissionregistration.k8s.io/v1
(GA in 1.30) and puts the node-name claim in pod-bound tokens (ServiceAccountTokenPodNodeInfo:
beta and on in 1.30-1.31, GA from 1.32), unless helm talks to a live cluster whose discovery lacks
admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy (the API turned off). Helm's offline
set (`helm template`) lists group/versions only, never kinds ("v1/Node"): there it is on.
true: on whatever discovery says; false: off.
*/}}
{{- define "omaticaya.vapEnabled" -}}
{{- $want := .Values.validatingAdmissionPolicy.enabled }}
{{- if eq (toString $want) "auto" }}
{{- $live := .Capabilities.APIVersions.Has "v1/Node" }}
{{- $served := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- if or $served (not $live) }}true{{ end }}
{{- else if $want }}true
{{- end }}
{{- end }}

{{/*
The kubelet's PodResources socket the agent reads (OMATICAYA_POD_RESOURCES_SOCKET), "" for none:
podResourcesSocket, else the kubelet's default path when the pod is the node's device plugin
or DRA driver (the telemetry then names the pod holding each GPU, DRA devices included; the
extender sees which GPUs and units the kubelet has handed out: without it a whole GPU
given to a pod that has not loaded its model yet looks free, and a shared GPU's units are not
counted); "off" turns it off.
*/}}
{{- define "omaticaya.podResourcesSocket" -}}
{{- $v := toString .Values.podResourcesSocket }}
{{- if eq $v "off" }}
{{- else if $v }}{{ $v }}
{{- else if or .Values.devicePlugin .Values.dra.enabled }}/var/lib/kubelet/pod-resources/kubelet.sock
{{- end }}
{{- end }}

{{/*
A nodeSelector map without its null entries: a user's null removes a default key
(--set 'nodeSelector.nvidia\.com/gpu\.present=null'), and helm upgrade --reuse-values hands the
null back to the templates, which the API server refuses; "" when nothing is left.
*/}}
{{- define "omaticaya.selector" -}}
{{- $out := dict }}
{{- range $k, $v := . }}{{ if not (kindIs "invalid" $v) }}{{ $_ := set $out $k $v }}{{ end }}{{ end }}
{{- if $out }}{{ toYaml $out }}{{ end }}
{{- end }}

{{/*
The placement policy, one for both sides of the seam (issue 38): placement.policy, rendered as
OMATICAYA_PLACEMENT_POLICY into the agent (the device plugin's choice of a slice's GPU) and the
scheduler extender (its choice of node and GPUs). The two values it replaces, set apart, made
the extender reserve a GPU the plugin would not hand out: either one set fails the render.
*/}}
{{- define "omaticaya.placementPolicy" -}}
{{- $removed := list }}
{{- if hasKey (.Values.sharing | default dict) "policy" }}
{{- $removed = append $removed (printf "sharing.policy (%v)" .Values.sharing.policy) }}
{{- end }}
{{- if hasKey ((.Values.scheduler | default dict).extender | default dict) "strategy" }}
{{- $removed = append $removed (printf "scheduler.extender.strategy (%v)" .Values.scheduler.extender.strategy) }}
{{- end }}
{{- if $removed }}
{{- fail (printf "%s: removed, use placement.policy (binpack or spread) instead: one policy that both the device plugin and the scheduler extender read (OMATICAYA_PLACEMENT_POLICY)" (join " and " $removed)) }}
{{- end }}
{{- .Values.placement.policy }}
{{- end }}

{{/*
"true" when the chart runs the MPS supervisor (the DaemonSet <fullname>-mps, its container `mps`,
`omaticaya mps`): the agent is the node's device plugin or DRA driver (a shared-GPU claim's
container becomes an MPS client the same way), some GPUs are shared and MPS enforces their
slices; else "".
*/}}
{{- define "omaticaya.mps" -}}
{{- if and (or .Values.devicePlugin (include "omaticaya.dra" .)) (ne (toString .Values.sharing.gpus) "none") (eq (toString .Values.sharing.enforcement) "mps") }}true{{ end }}
{{- end }}

{{/*
Where the supervisor writes each daemon's state and the plugins read it and write their slice
requests (OMATICAYA_MPS_STATE_DIR), in both pods: the volume mps-state, the host folder
omaticaya.mpsStateHostDir. Not the code's default (/run/omaticaya-mps-state) inside the
containers: the mps container's /run is an emptyDir the supervisor binds the root into, and a
volume mounted there would leave its mount point on the host.
*/}}
{{- define "omaticaya.mpsStateDir" -}}/var/lib/omaticaya/mps-state{{- end }}

{{/*
The host folder of the daemons' states (the hostPath mps-state, DirectoryOrCreate, in the agent's
pod and the mps pod: two pods since the supervisor left the agent's, so an emptyDir cannot be
shared). Under /run (a tmpfs: no state outlives a reboot) and beside the supervisor's root, not in
its parent: the kubelet creates a hostPath folder and never removes it, and the supervisor must
still be able to remove the root's parent (/run/omaticaya) it made. The supervisor removes its
state files when it stops (the plugins' requests stay, for the next supervisor); the folder
stays until the node reboots.
*/}}
{{- define "omaticaya.mpsStateHostDir" -}}/run/omaticaya-mps-state{{- end }}

{{/* The MPS supervisor's DaemonSet: <fullname>-mps (63 characters at most). */}}
{{- define "omaticaya.mpsName" -}}
{{- printf "%s-mps" (include "omaticaya.fullname" . | trunc 59 | trimSuffix "-") }}
{{- end }}

{{/*
Selector labels of the MPS supervisor's pods (immutable on its DaemonSet). Its own name, not the
agent's: the agent's DaemonSet selects name and instance, and a pod of the other DaemonSet that
it matched could be adopted and replaced by it once orphaned (kubectl delete --cascade=orphan).
*/}}
{{- define "omaticaya.mpsSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-mps" (include "omaticaya.name" . | trunc 59 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of the MPS supervisor's pods: no helm.sh/chart, so that a new chart version alone does not
change its pod template (its DaemonSet's own labels have it).
*/}}
{{- define "omaticaya.mpsPodLabels" -}}
{{ include "omaticaya.mpsSelectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: mps
{{- end }}

{{/*
The host folder the mps container mounts at /host<folder>: two levels above sharing.mps.root
(/run for /run/omaticaya/mps), so that the supervisor creates the root and its parent itself and
removes both on SIGTERM (a hostPath of the root or its parent would be created by the kubelet and
left on the host). Refuses "/" (a root less than three levels deep).
*/}}
{{- define "omaticaya.mpsHostDir" -}}
{{- $root := clean (toString .Values.sharing.mps.root) }}
{{- $dir := dir (dir $root) }}
{{- if or (not (isAbs $root)) (eq $dir "/") }}
{{- fail (printf "sharing.mps.root %s: expected an absolute folder at least three levels deep (like /run/omaticaya/mps): the mps container mounts the host folder two levels up" $root) }}
{{- end }}
{{- $dir }}
{{- end }}

{{/*
The control daemon binary: sharing.mps.control, else the NVIDIA runtime's nvidia-cuda-mps-control,
or with a trace (no GPU, no NVIDIA runtime) the image's stand-in.
*/}}
{{- define "omaticaya.mpsControl" -}}
{{- .Values.sharing.mps.control | default (ternary "/opt/omaticaya/standin/nvidia-cuda-mps-control" "nvidia-cuda-mps-control" (not (empty .Values.trace))) }}
{{- end }}

{{/*
OMATICAYA_MPS_STALE_S: a daemon's state older than this counts as down. The supervisor writes it
every sharing.mps.checkS: three checks and 5 s of slack, at least the code's 15 s.
*/}}
{{- define "omaticaya.mpsStaleS" -}}
{{- maxf 15 (addf (mulf .Values.sharing.mps.checkS 3) 5) | toString }}
{{- end }}

{{/*
"true" when the pod is the node's DRA driver gpu.omaticaya.io (dra.enabled: the agent publishes
its Node's ResourceSlice and runs the kubelet DRA plugin, OMATICAYA_DRA), else "". Fails the
render when devicePlugin is on too (the kubelet would hand each GPU out twice; the agent refuses
to start with both) and below Kubernetes 1.34 (no resource.k8s.io/v1).
*/}}
{{- define "omaticaya.dra" -}}
{{- if .Values.dra.enabled }}
{{- if .Values.devicePlugin }}
{{- fail "dra.enabled and devicePlugin are both true: a node's GPUs are served by one of the two (the kubelet would hand each GPU out twice, and the agent refuses OMATICAYA_DRA with OMATICAYA_DEVICE_PLUGIN); set devicePlugin=false to use DRA, or dra.enabled=false to keep the device plugin" }}
{{- end }}
{{- $kube := include "omaticaya.kubeVersion" . }}
{{- if semverCompare "<1.34.0-0" $kube }}
{{- fail (printf "dra.enabled needs resource.k8s.io/v1 (DRA, GA in Kubernetes 1.34): Kubernetes %s does not serve it; use devicePlugin=true there (with helm template, pass --kube-version)" $kube) }}
{{- end -}}
true
{{- end }}
{{- end }}

{{/* The DRA driver's name: the ResourceSlices' spec.driver, the attributes' domain, the kubelet plugin's name. */}}
{{- define "omaticaya.draDriver" -}}gpu.omaticaya.io{{- end }}

{{/* OMATICAYA_DRA_PLUGIN_DIR: the plugin's own folder under the kubelet's plugins folder. */}}
{{- define "omaticaya.draPluginDir" -}}
{{- printf "%s/%s" (clean (toString .Values.dra.kubeletPluginsDir) | trimSuffix "/") (include "omaticaya.draDriver" .) }}
{{- end }}

{{/*
OMATICAYA_DRA_DEV_ROOT: the host's dra.devRoot as the agent sees it (mounted read-only at
/host<devRoot>) with DRA on; else the code's default /dev (nothing mounted, nothing reads it).
*/}}
{{- define "omaticaya.draDevRoot" -}}
{{- if include "omaticaya.dra" . }}{{ printf "/host%s" (clean (toString .Values.dra.devRoot)) }}{{ else }}/dev{{ end }}
{{- end }}
