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
{{- if not .Values.serviceAccount.name }}{{ include "omaticaya.fail" "serviceAccount.name is required when serviceAccount.create is false" }}{{ end }}
{{- .Values.serviceAccount.name }}
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
{{- include "omaticaya.fail" (printf "cannot read a Kubernetes version from %q" .Capabilities.KubeVersion.Version) }}
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
{{- include "omaticaya.fail" (printf "scheduler.configApiVersion %s is not read by kube-scheduler %s: every supported Kubernetes (1.31 and later) reads %s only; leave it empty" $api (include "omaticaya.kubeVersion" .) $v1) }}
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
and no preemptVerb. An unquoted `off` in a values file is YAML's false (and `on` true): false
is read as "off", true as "on".
*/}}
{{- define "omaticaya.schedulerPreemption" -}}
{{- if not (has (toString .Values.scheduler.preemption) (list "off" "false")) }}true{{ end }}
{{- end }}

{{/*
The pods' PriorityClass: priorityClassName, else system-node-critical when the pod is the node's
device plugin or DRA driver (the kubelet must not evict what serves its GPUs), else none.
*/}}
{{- define "omaticaya.priorityClassName" -}}
{{- .Values.priorityClassName | default (ternary "system-node-critical" "" (or (eq (include "omaticaya.devicePlugin" .) "true") (eq (include "omaticaya.dra" .) "true"))) }}
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
counted); "off" turns it off (and false: an unquoted `off` in a values file is YAML's false).
*/}}
{{- define "omaticaya.podResourcesSocket" -}}
{{- $v := toString .Values.podResourcesSocket }}
{{- if or (eq $v "off") (eq $v "false") }}
{{- else if $v }}{{ $v }}
{{- else if or (include "omaticaya.devicePlugin" .) .Values.dra.enabled }}/var/lib/kubelet/pod-resources/kubelet.sock
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
{{- include "omaticaya.fail" (printf "%s: removed, use placement.policy (binpack or spread) instead: one policy that both the device plugin and the scheduler extender read (OMATICAYA_PLACEMENT_POLICY)" (join " and " $removed)) }}
{{- end }}
{{- .Values.placement.policy }}
{{- end }}

{{/*
The settle time, one for both sides of the seam (issue 49): placement.settleS, rendered as
OMATICAYA_SETTLE_S into the agent (a slice's memory counts on its GPU until the reading shows
it) and the scheduler extender (a placed pod's). The two values it replaces, set apart, made the
two sides count a pod's memory for different times: either one set fails the render.
*/}}
{{- define "omaticaya.settleS" -}}
{{- $removed := list }}
{{- if hasKey (.Values.sharing | default dict) "settleS" }}
{{- $removed = append $removed (printf "sharing.settleS (%v)" .Values.sharing.settleS) }}
{{- end }}
{{- if hasKey ((.Values.scheduler | default dict).extender | default dict) "settleS" }}
{{- $removed = append $removed (printf "scheduler.extender.settleS (%v)" .Values.scheduler.extender.settleS) }}
{{- end }}
{{- if $removed }}
{{- include "omaticaya.fail" (printf "%s: removed, use placement.settleS instead: one settle time that both the device plugin and the scheduler extender read (OMATICAYA_SETTLE_S)" (join " and " $removed)) }}
{{- end }}
{{- .Values.placement.settleS }}
{{- end }}

{{/*
"true" when the chart runs the MPS supervisor (the DaemonSet <fullname>-mps, its container `mps`,
`omaticaya mps`): the agent is the node's device plugin or DRA driver (a shared-GPU claim's
container becomes an MPS client the same way), some GPUs are shared and MPS enforces their
slices; else "".
*/}}
{{- define "omaticaya.mps" -}}
{{- if and (or (include "omaticaya.devicePlugin" .) (include "omaticaya.dra" .)) (ne (toString .Values.sharing.gpus) "none") (eq (toString .Values.sharing.enforcement) "mps") }}true{{ end }}
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
{{- include "omaticaya.fail" (printf "sharing.mps.root %s: expected an absolute folder at least three levels deep (like /run/omaticaya/mps): the mps container mounts the host folder two levels up" $root) }}
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
{{- if include "omaticaya.devicePlugin" . }}
{{- include "omaticaya.fail" "dra.enabled and devicePlugin.enabled are both true: a node's GPUs are served by one of the two (the kubelet would hand each GPU out twice, and the agent refuses OMATICAYA_DRA with OMATICAYA_DEVICE_PLUGIN); set devicePlugin.enabled=false to use DRA, or dra.enabled=false to keep the device plugin" }}
{{- end }}
{{- $kube := include "omaticaya.kubeVersion" . }}
{{- if semverCompare "<1.34.0-0" $kube }}
{{- include "omaticaya.fail" (printf "dra.enabled needs resource.k8s.io/v1 (DRA, GA in Kubernetes 1.34): Kubernetes %s does not serve it; use devicePlugin.enabled=true there (with helm template, pass --kube-version)" $kube) }}
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
The host's device folder the DRA plugin reads: dra.devRoot, else <driverRoot>/dev (/dev for a
driver installed on the host, /run/nvidia/driver/dev for the GPU Operator's driver container).
*/}}
{{- define "omaticaya.draHostDevRoot" -}}
{{- clean (toString .Values.dra.devRoot | default (printf "%s/dev" (toString .Values.driverRoot))) }}
{{- end }}

{{/*
OMATICAYA_DRA_DEV_ROOT: the host's device folder (omaticaya.draHostDevRoot) as the agent sees it
(mounted read-only at /host<folder>) with DRA on; else the code's default /dev (nothing mounted,
nothing reads it).
*/}}
{{- define "omaticaya.draDevRoot" -}}
{{- if include "omaticaya.dra" . }}{{ printf "/host%s" (include "omaticaya.draHostDevRoot" .) }}{{ else }}/dev{{ end }}
{{- end }}

{{/*
Fail the render with msg (a string): helm template and helm install stop with it. helm lint runs
the templates with a fail that only logs (its lint mode), so the include below, reached only
there, makes lint refuse the same values, naming msg in its error.
*/}}
{{- define "omaticaya.fail" -}}
{{- fail . -}}
{{- include (printf "omaticaya: %s" .) dict -}}
{{- end }}

{{/*
"true" when the agent is the node's device plugin: devicePlugin.enabled (the GPU Operator's
spelling), or devicePlugin as a boolean (the old form, still read; NOTES.txt says it is
deprecated); else "".
*/}}
{{- define "omaticaya.devicePlugin" -}}
{{- $v := .Values.devicePlugin }}
{{- if kindIs "map" $v }}{{ if $v.enabled }}true{{ end }}
{{- else if $v }}true
{{- end }}
{{- end }}

{{/*
The schedule (OMATICAYA_SCHEDULE), checked as the agent parses it: the pattern mirrors
omaticaya_py/core/config/schedule.py's parse_schedule (the @hourly-style macros; '@every' and a Go
duration of h, m, s, ms parts, 100ms to 366 days; a 5-field crontab or 6 fields with seconds
first, '?' as '*', each field's numbers within APScheduler's CronTrigger ranges, steps above 0,
month and weekday names, weekdays 0-7, day 'last'). What it does not check, the agent still
refuses at start: a reversed range (5-3) and a step longer than its range (10-20/15).
tests/charts/test_chart_values_mistakes.py holds the two to one table of examples.
*/}}
{{- define "omaticaya.schedule" -}}
{{- $s := toString .Values.schedule }}
{{- $form := "a 5-field crontab ('*/5 * * * *'), 6 fields with seconds first ('*/5 * * * * ?'), '@every 30s' (h, m, s, ms) or @hourly/@daily" }}
{{- if not (regexMatch `^\s*(?:(?i:@yearly|@annually|@monthly|@weekly|@daily|@midnight|@hourly)|(?i:@every)\s*(?:[0-9]+(?:\.[0-9]+)?(?:ms|h|m|s))+|(?:(?:(?:[*?]|0*(?:[0-5]?[0-9])(?:-0*(?:[0-5]?[0-9]))?)(?:/0*(?:[1-9]|[1-5][0-9]))?)(?:,(?:(?:[*?]|0*(?:[0-5]?[0-9])(?:-0*(?:[0-5]?[0-9]))?)(?:/0*(?:[1-9]|[1-5][0-9]))?))*\s+)?(?:(?:[*?]|0*(?:[0-5]?[0-9])(?:-0*(?:[0-5]?[0-9]))?)(?:/0*(?:[1-9]|[1-5][0-9]))?)(?:,(?:(?:[*?]|0*(?:[0-5]?[0-9])(?:-0*(?:[0-5]?[0-9]))?)(?:/0*(?:[1-9]|[1-5][0-9]))?))*\s+(?:(?:[*?]|0*(?:1?[0-9]|2[0-3])(?:-0*(?:1?[0-9]|2[0-3]))?)(?:/0*(?:[1-9]|1[0-9]|2[0-3]))?)(?:,(?:(?:[*?]|0*(?:1?[0-9]|2[0-3])(?:-0*(?:1?[0-9]|2[0-3]))?)(?:/0*(?:[1-9]|1[0-9]|2[0-3]))?))*\s+(?:(?:[*?]|0*(?:[1-9]|[12][0-9]|3[01])(?:-0*(?:[1-9]|[12][0-9]|3[01]))?)(?:/0*(?:[1-9]|[12][0-9]|30))?|(?i:last))(?:,(?:(?:[*?]|0*(?:[1-9]|[12][0-9]|3[01])(?:-0*(?:[1-9]|[12][0-9]|3[01]))?)(?:/0*(?:[1-9]|[12][0-9]|30))?|(?i:last)))*\s+(?:(?:[*?]|0*(?:[1-9]|1[0-2])(?:-0*(?:[1-9]|1[0-2]))?)(?:/0*(?:[1-9]|1[01]))?|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)(?:-(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))?)(?:,(?:(?:[*?]|0*(?:[1-9]|1[0-2])(?:-0*(?:[1-9]|1[0-2]))?)(?:/0*(?:[1-9]|1[01]))?|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)(?:-(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))?))*\s+(?:(?:[*?]|(?:0*[0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)[A-Za-z]*)(?:-(?:0*[0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)[A-Za-z]*))?)(?:/0*[1-9][0-9]*)?)(?:,(?:(?:[*?]|(?:0*[0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)[A-Za-z]*)(?:-(?:0*[0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)[A-Za-z]*))?)(?:/0*[1-9][0-9]*)?))*)\s*$` $s) }}
{{- include "omaticaya.fail" (printf "schedule '%s': expected %s (the agent exits on any other form)" $s $form) }}
{{- end }}
{{- if regexMatch `(?i)^\s*@every` $s }}
{{- $units := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 }}
{{- $total := 0.0 }}
{{- range regexFindAll `[0-9]+(\.[0-9]+)?(ms|h|m|s)` (regexReplaceAll `(?i)^\s*@every` $s "") -1 }}
{{- $n := regexFind `^[0-9.]+` . }}
{{- $total = addf $total (mulf (float64 $n) (get $units (trimPrefix $n .))) }}
{{- end }}
{{- if or (lt $total 0.1) (gt $total 31622400.0) }}
{{- include "omaticaya.fail" (printf "schedule '%s': @every takes 100ms to 366 days (the agent exits on any other interval)" $s) }}
{{- end }}
{{- end }}
{{- $s }}
{{- end }}

{{/*
The chart's own checks of values that render but fail or misbehave on the cluster, each failing
the render (and helm lint) with the reason and what to set:
- sharing.gpus without devicePlugin.enabled or dra.enabled: nothing serves the shared GPUs' units,
  and the agent leaves those GPUs out of the whole-GPU labels (gpu.memory.free-mib 0,
  gpu.healthy-count 0 when all are shared): every nodeAffinity on them stops matching;
- sharing.resource equal to devicePluginResource: the agent refuses it at start (core/config/settings.py,
  DevicePluginSettings._two_resources), whether the device plugin is on or not.
*/}}
{{- define "omaticaya.checks" -}}
{{- $shared := ne (toString .Values.sharing.gpus) "none" }}
{{- if and $shared (not (include "omaticaya.devicePlugin" .)) (not .Values.dra.enabled) }}
{{- include "omaticaya.fail" (printf "sharing.gpus %v shares GPUs by memory, which only the device plugin or the DRA driver serves: with neither on, nothing hands out their units and the agent leaves them out of the whole-GPU labels (gpu.memory.free-mib and gpu.healthy-count drop to 0 when every GPU is shared); set devicePlugin.enabled=true (Kubernetes 1.31+) or dra.enabled=true (1.34+), or sharing.gpus=none for labels only" .Values.sharing.gpus) }}
{{- end }}
{{- if eq (toString .Values.sharing.resource) (toString .Values.devicePluginResource) }}
{{- include "omaticaya.fail" (printf "sharing.resource %s is also devicePluginResource: the units of shared GPUs need a resource name of their own (a GPU is served whole or in units, never both; the agent exits on it); keep the default omaticaya.io/gpu-memory or pick another <domain>/<name>" .Values.sharing.resource) }}
{{- end }}
{{- end }}

{{/*
With dra.enabled on Kubernetes 1.34 to 1.36, which DRA features the driver uses need which
feature gate (docs/dra.md, "Which path for which cluster"): on 1.34 and 1.35 device taints
(KEP-5055), consumable capacity (KEP-5075, with sharing.gpus) and DRA-backed extended resources
(KEP-5004, with dra.extendedResourceName) are alpha, off; on 1.36 beta, on by default. "" on 1.37
and later, or without DRA. NOTES.txt prints it; the DaemonSet carries it as a comment for
helm template.
*/}}
{{- define "omaticaya.draGates" -}}
{{- if include "omaticaya.dra" . }}
{{- $kube := include "omaticaya.kubeVersion" . }}
{{- if semverCompare "<1.36.0-0" $kube }}
Kubernetes {{ $kube }}: DRA is GA, but these features the driver uses are alpha, off unless their
feature gate is on (--feature-gates on kube-apiserver, kube-scheduler, kube-controller-manager and
every kubelet; docs/dra.md, "Which path for which cluster"):
  - DRADeviceTaints: the taint on an unhealthy GPU's device (without it the API server drops the
    taint, and new claims can get an unhealthy GPU); with it, kube-apiserver must also serve
    resource.k8s.io/v1alpha3 (--runtime-config=resource.k8s.io/v1alpha3=true): a kube-scheduler
    with the gate on waits for DeviceTaintRules and schedules no pod until it can list them;
{{- if ne (toString .Values.sharing.gpus) "none" }}
  - DRAConsumableCapacity: sharing by memory (sharing.gpus {{ .Values.sharing.gpus }}: the shared GPUs' memory capacity;
    without it no claim of shared.{{ include "omaticaya.draDriver" . }} is allocated);
{{- end }}
{{- with .Values.dra.extendedResourceName }}
  - DRAExtendedResource: pods asking {{ . }} get a device of {{ include "omaticaya.draDriver" . }} (without it they wait
    for a device plugin);
{{- end }}
{{- else if semverCompare "<1.37.0-0" $kube }}
Kubernetes {{ $kube }}: device taints (DRADeviceTaints){{ if ne (toString .Values.sharing.gpus) "none" }}, sharing by memory (DRAConsumableCapacity){{ end }}{{ with .Values.dra.extendedResourceName }} and
the extended resource {{ . }} (DRAExtendedResource){{ end }} are beta, on by default: check that
your cluster does not turn those feature gates off (docs/dra.md, "Which path for which cluster").
{{- end }}
{{- end }}
{{- end }}

{{/*
Pod Security (docs/install.md, "Pod Security"; issue 52). The template files that render pods
(Pod, DaemonSet, Deployment, Job), read again by omaticaya.podSecurity: a new one must be named here
(tests/charts/test_chart_pod_security.py checks every goal's render against this list).
*/}}
{{- define "omaticaya.podSecurityTemplates" -}}daemonset.yaml mps-daemonset.yaml scheduler.yaml uninstall-hook.yaml tests/agent-labels.yaml{{- end }}

{{/*
What in this render's pods the Pod Security Standards forbid, as JSON:
{"baseline": [...], "restricted": [...]}, one entry per workload ("DaemonSet omaticaya: hostPath
volumes device-plugins (/var/lib/kubelet/device-plugins), ..."); "restricted" holds baseline's
too (each level includes the one below). The pods are the templates of
omaticaya.podSecurityTemplates rendered again and read field by field, as the PodSecurity
admission plugin reads them (k8s.io/pod-security-admission/policy, v0.37.2):
- baseline: hostNetwork, hostPID, hostIPC; privileged; capabilities.add beyond the default set;
  hostPath volumes; hostPort; seccomp or AppArmor Unconfined; procMount other than Default;
  seLinuxOptions user or role, or a type other than container_t, container_init_t,
  container_kvm_t, container_engine_t; sysctls outside the safe set; windowsOptions.hostProcess;
- restricted, in addition: volume types other than configMap, csi, downwardAPI, emptyDir,
  ephemeral, image, persistentVolumeClaim, projected, secret; allowPrivilegeEscalation not false;
  runAsNonRoot not true and runAsUser 0 (unless hostUsers is false); a seccomp type neither
  RuntimeDefault nor Localhost; capabilities.drop without ALL, capabilities.add beyond
  NET_BIND_SERVICE.
Not read: probes' and lifecycle handlers' host (no value of this chart sets one).
*/}}
{{- define "omaticaya.podSecurity" -}}
{{- $top := . }}
{{- $baseline := list }}
{{- $restricted := list }}
{{- $defaultCaps := list "AUDIT_WRITE" "CHOWN" "DAC_OVERRIDE" "FOWNER" "FSETID" "KILL" "MKNOD" "NET_BIND_SERVICE" "SETFCAP" "SETGID" "SETPCAP" "SETUID" "SYS_CHROOT" }}
{{- $volumeTypes := list "configMap" "csi" "downwardAPI" "emptyDir" "ephemeral" "image" "persistentVolumeClaim" "projected" "secret" }}
{{- $seLinuxTypes := list "" "container_t" "container_init_t" "container_kvm_t" "container_engine_t" }}
{{- $safeSysctls := list "kernel.shm_rmid_forced" "net.ipv4.ip_local_port_range" "net.ipv4.ip_unprivileged_port_start" "net.ipv4.tcp_syncookies" "net.ipv4.ping_group_range" "net.ipv4.ip_local_reserved_ports" "net.ipv4.tcp_keepalive_time" "net.ipv4.tcp_fin_timeout" "net.ipv4.tcp_keepalive_intvl" "net.ipv4.tcp_keepalive_probes" "net.ipv4.tcp_rmem" "net.ipv4.tcp_wmem" }}
{{- range $file := splitList " " (include "omaticaya.podSecurityTemplates" $top) }}
{{- range $text := regexSplit "(?m)^---[ \t]*$" (include (printf "%s/%s" $top.Template.BasePath $file) $top) -1 }}
{{- $doc := fromYaml $text }}
{{- $spec := ternary (dig "spec" dict $doc) (dig "spec" "template" "spec" dict $doc) (eq (toString $doc.kind) "Pod") }}
{{- if and (has (toString $doc.kind) (list "Pod" "DaemonSet" "Deployment" "Job")) $spec }}
{{- $b := list }}
{{- $r := list }}
{{- $psc := $spec.securityContext | default dict }}
{{- $rootOk := eq (toString $spec.hostUsers) "false" }}
{{- range $k := list "hostNetwork" "hostPID" "hostIPC" }}
{{- if index $spec $k }}{{ $b = append $b (printf "%s true" $k) }}{{ end }}
{{- end }}
{{- $hostPaths := list }}
{{- range $v := $spec.volumes }}
{{- if $v.hostPath }}{{ $hostPaths = append $hostPaths (printf "%s (%s)" $v.name $v.hostPath.path) }}
{{- else }}
{{- range $k := keys (omit $v "name") | sortAlpha }}
{{- if not (has $k $volumeTypes) }}{{ $r = append $r (printf "volume %s of type %s" $v.name $k) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $hostPaths }}{{ $b = append $b (printf "hostPath volumes %s" (join ", " $hostPaths)) }}{{ end }}
{{- if eq (dig "seccompProfile" "type" "" $psc) "Unconfined" }}{{ $b = append $b "pod seccompProfile Unconfined" }}{{ end }}
{{- if eq (dig "appArmorProfile" "type" "" $psc) "Unconfined" }}{{ $b = append $b "pod appArmorProfile Unconfined" }}{{ end }}
{{- with $psc.seLinuxOptions }}
{{- if or .user .role (not (has (toString (.type | default "")) $seLinuxTypes)) }}{{ $b = append $b "pod seLinuxOptions" }}{{ end }}
{{- end }}
{{- range $s := $psc.sysctls }}
{{- if not (has $s.name $safeSysctls) }}{{ $b = append $b (printf "sysctl %s" $s.name) }}{{ end }}
{{- end }}
{{- if dig "windowsOptions" "hostProcess" false $psc }}{{ $b = append $b "pod windowsOptions.hostProcess" }}{{ end }}
{{- if and (not $rootOk) (hasKey $psc "runAsUser") (eq (int64 $psc.runAsUser) 0) }}{{ $r = append $r "pod runAsUser 0" }}{{ end }}
{{- if and (not $rootOk) (eq (toString $psc.runAsNonRoot) "false") }}{{ $r = append $r "pod runAsNonRoot false" }}{{ end }}
{{- range $c := concat ($spec.initContainers | default list) ($spec.containers | default list) }}
{{- $sc := $c.securityContext | default dict }}
{{- $who := printf "container %s" $c.name }}
{{- if $sc.privileged }}{{ $b = append $b (printf "privileged %s" $who) }}{{ end }}
{{- if dig "windowsOptions" "hostProcess" false $sc }}{{ $b = append $b (printf "%s windowsOptions.hostProcess" $who) }}{{ end }}
{{- range $cap := dig "capabilities" "add" list $sc }}
{{- if not (has $cap $defaultCaps) }}{{ $b = append $b (printf "%s adds capability %s" $who $cap) }}
{{- else if ne $cap "NET_BIND_SERVICE" }}{{ $r = append $r (printf "%s adds capability %s" $who $cap) }}{{ end }}
{{- end }}
{{- if not (has "ALL" (dig "capabilities" "drop" list $sc)) }}{{ $r = append $r (printf "%s does not drop ALL capabilities" $who) }}{{ end }}
{{- range $p := $c.ports }}
{{- if $p.hostPort }}{{ $b = append $b (printf "%s hostPort %v" $who $p.hostPort) }}{{ end }}
{{- end }}
{{- $seccomp := dig "seccompProfile" "type" "" $sc }}
{{- if eq $seccomp "Unconfined" }}{{ $b = append $b (printf "%s seccompProfile Unconfined" $who) }}{{ end }}
{{- if not (has ($seccomp | default (dig "seccompProfile" "type" "" $psc)) (list "RuntimeDefault" "Localhost")) }}{{ $r = append $r (printf "%s without seccompProfile RuntimeDefault or Localhost" $who) }}{{ end }}
{{- if eq (dig "appArmorProfile" "type" "" $sc) "Unconfined" }}{{ $b = append $b (printf "%s appArmorProfile Unconfined" $who) }}{{ end }}
{{- if and $sc.procMount (ne (toString $sc.procMount) "Default") }}{{ $b = append $b (printf "%s procMount %s" $who $sc.procMount) }}{{ end }}
{{- with $sc.seLinuxOptions }}
{{- if or .user .role (not (has (toString (.type | default "")) $seLinuxTypes)) }}{{ $b = append $b (printf "%s seLinuxOptions" $who) }}{{ end }}
{{- end }}
{{- if ne (toString $sc.allowPrivilegeEscalation) "false" }}{{ $r = append $r (printf "%s without allowPrivilegeEscalation false" $who) }}{{ end }}
{{- if not $rootOk }}
{{- $nonRoot := ternary $sc.runAsNonRoot $psc.runAsNonRoot (hasKey $sc "runAsNonRoot") }}
{{- if ne (toString $nonRoot) "true" }}{{ $r = append $r (printf "%s without runAsNonRoot true" $who) }}{{ end }}
{{- if and (hasKey $sc "runAsUser") (eq (int64 $sc.runAsUser) 0) }}{{ $r = append $r (printf "%s runAsUser 0" $who) }}{{ end }}
{{- end }}
{{- end }}
{{- $name := printf "%s %s" $doc.kind $doc.metadata.name }}
{{- if $b }}{{ $baseline = append $baseline (printf "%s: %s" $name (join "; " $b)) }}{{ end }}
{{- if or $b $r }}{{ $restricted = append $restricted (printf "%s: %s" $name (join "; " (concat $b $r))) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- dict "baseline" $baseline "restricted" $restricted | toJson }}
{{- end }}

{{/*
The Pod Security level this render's pods need: "privileged" when something breaks baseline
(hostPath volumes, a privileged container ...), "baseline" when only restricted is broken,
else "restricted" (omaticaya.podSecurity says what).
*/}}
{{- define "omaticaya.podSecurityLevel" -}}
{{- $found := include "omaticaya.podSecurity" . | fromJson }}
{{- if $found.baseline }}privileged{{ else if $found.restricted }}baseline{{ else }}restricted{{ end }}
{{- end }}

{{/*
Fails the install when the release's Namespace enforces a Pod Security level its pods break
(the label pod-security.kubernetes.io/enforce, read with lookup): the PodSecurity admission would
admit the DaemonSets and Deployments and reject every pod, and `helm install --wait` would only
time out. Passes when helm asks no cluster (helm template, helm lint: lookup returns nothing),
when the Namespace is not there yet (helm install --create-namespace renders first) or has no
enforce label (the cluster's default then applies, which helm cannot read), and on the warn and
audit labels, which reject nothing. omaticaya.podSecurityRefusal judges the labels.
*/}}
{{- define "omaticaya.podSecurityCheck" -}}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace }}
{{- include "omaticaya.podSecurityRefusal" (dict "top" . "labels" (dig "metadata" "labels" dict $ns)) }}
{{- end }}

{{/*
Fails the render with what to do when a Namespace of these labels (.labels, a map; .top the
chart's context) enforces a level this render's pods break; renders nothing otherwise. An
enforce value that is not a level is enforced as "restricted" (the admission fails closed:
k8s.io/pod-security-admission/api ParseLevel).
*/}}
{{- define "omaticaya.podSecurityRefusal" -}}
{{- $key := "pod-security.kubernetes.io/enforce" }}
{{- if hasKey .labels $key }}
{{- $ns := .top.Release.Namespace }}
{{- $set := toString (index .labels $key) }}
{{- $level := ternary $set "restricted" (has $set (list "privileged" "baseline" "restricted")) }}
{{- $found := include "omaticaya.podSecurity" .top | fromJson }}
{{- $broken := index $found $level | default list }}
{{- if $broken }}
{{- $need := include "omaticaya.podSecurityLevel" .top }}
{{- $enforces := ternary (printf "enforces Pod Security %q" $level) (printf "has %s=%q, not a level (privileged, baseline, restricted), which Pod Security enforces as \"restricted\"" $key $set) (eq $set $level) }}
{{- include "omaticaya.fail" (printf "namespace %s %s; this release's pods need %q, and the API server would reject them (%s). Label the namespace: kubectl label namespace %s %s=%s --overwrite, or install into a namespace of its own (docs/install.md, \"Pod Security\")" $ns $enforces $need (join "; " $broken) $ns $key $need) }}
{{- end }}
{{- end }}
{{- end }}
