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
KubeSchedulerConfiguration API versions and the kube-scheduler releases that serve them
(k8s.io/kube-scheduler config/<version>/types.go at tags v0.19.0 ... v0.36.0):
  v1beta1 1.19-1.22 (removed in 1.23), v1beta2 1.22-1.27 (removed in 1.28),
  v1beta3 1.23-1.28 (removed in 1.29), v1 1.25 and later.
*/}}
{{- define "omaticaya.schedulerConfigRanges" -}}
kubescheduler.config.k8s.io/v1beta1: ">=1.19.0-0 <1.23.0-0"
kubescheduler.config.k8s.io/v1beta2: ">=1.22.0-0 <1.28.0-0"
kubescheduler.config.k8s.io/v1beta3: ">=1.23.0-0 <1.29.0-0"
kubescheduler.config.k8s.io/v1: ">=1.25.0-0"
{{- end }}

{{/*
The scheduler's KubeSchedulerConfiguration apiVersion: scheduler.configApiVersion, or the newest
one the cluster's kube-scheduler reads (v1 from 1.25, v1beta3 on 1.23-1.24, v1beta1 before).
An explicit one the cluster's version does not serve fails the render.
*/}}
{{- define "omaticaya.schedulerConfigApiVersion" -}}
{{- $kv := include "omaticaya.kubeVersion" . }}
{{- $ranges := include "omaticaya.schedulerConfigRanges" . | fromYaml }}
{{- $api := .Values.scheduler.configApiVersion }}
{{- if not $api }}
{{- if semverCompare ">=1.25.0-0" $kv }}{{ $api = "kubescheduler.config.k8s.io/v1" }}
{{- else if semverCompare ">=1.23.0-0" $kv }}{{ $api = "kubescheduler.config.k8s.io/v1beta3" }}
{{- else }}{{ $api = "kubescheduler.config.k8s.io/v1beta1" }}
{{- end }}
{{- end }}
{{- if not (semverCompare (get $ranges $api) $kv) }}
{{- fail (printf "scheduler.configApiVersion %s is not read by kube-scheduler %s (it is for Kubernetes %s); leave it empty to pick the right one" $api $kv (get $ranges $api)) }}
{{- end }}
{{- $api }}
{{- end }}

{{/* The kube-scheduler image tag: scheduler.image.tag, or the cluster's own version. */}}
{{- define "omaticaya.schedulerImageTag" -}}
{{- .Values.scheduler.image.tag | default (include "omaticaya.kubeVersion" .) }}
{{- end }}

{{/*
The kube-scheduler version the scheduler pod runs, as vMAJOR.MINOR.PATCH: its image tag when that
reads as a version (scheduler.image.tag "v1.21.3"), else the cluster's.
*/}}
{{- define "omaticaya.schedulerVersion" -}}
{{- $tag := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" (include "omaticaya.schedulerImageTag" .) | trimPrefix "v" }}
{{- if $tag }}{{ printf "v%s" $tag }}{{ else }}{{ include "omaticaya.kubeVersion" . }}{{ end }}
{{- end }}

{{/*
"true" when the scheduler runs preemption (kube-scheduler's DefaultPreemption PostFilter and the
extender's preemptVerb). scheduler.preemption "auto": where its kube-scheduler is 1.22 or later.
Before, 1.20/1.21 releases without the fix of kubernetes#102971 never call the extender on
preemption, and a pod asking GPU memory by annotation only, with two or more candidate nodes that
hold lower-priority pods, panics them (kubernetes#101548, seen on v1.20.2): off, with the
PostFilter plugins disabled. "on" / "off": as said.
*/}}
{{- define "omaticaya.schedulerPreemption" -}}
{{- $want := toString .Values.scheduler.preemption }}
{{- if eq $want "on" }}true
{{- else if and (eq $want "auto") (semverCompare ">=1.22.0-0" (include "omaticaya.schedulerVersion" .)) }}true
{{- end }}
{{- end }}

{{/*
The pods' PriorityClass: priorityClassName, else system-node-critical when the pod is the node's
device plugin (the kubelet must not evict what serves its GPUs), else none.
*/}}
{{- define "omaticaya.priorityClassName" -}}
{{- .Values.priorityClassName | default (ternary "system-node-critical" "" (eq (toString .Values.devicePlugin) "true")) }}
{{- end }}

{{/*
"true" when the admission policies are rendered. validatingAdmissionPolicy.enabled "auto" (the
default): on Kubernetes >= 1.30 (admissionregistration.k8s.io/v1 GA and the node-name claim in
pod-bound tokens, ServiceAccountTokenPodNodeInfo beta), unless helm talks to a live cluster
whose discovery lacks admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy (the API turned
off). Helm's offline set (`helm template`) lists group/versions only, never kinds ("v1/Node"):
there the version decides. true: on, and an older cluster fails the render; false: off.
*/}}
{{- define "omaticaya.vapEnabled" -}}
{{- $want := .Values.validatingAdmissionPolicy.enabled }}
{{- $v130 := semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}
{{- if eq (toString $want) "auto" }}
{{- $live := .Capabilities.APIVersions.Has "v1/Node" }}
{{- $served := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- if and $v130 (or $served (not $live)) }}true{{ end }}
{{- else if $want }}
{{- if not $v130 }}
{{- fail (printf "validatingAdmissionPolicy.enabled needs Kubernetes >= 1.30 (admissionregistration.k8s.io/v1 and the node-name claim in service account tokens); this cluster is %s (leave it \"auto\": on from 1.30, off before)" .Capabilities.KubeVersion.Version) }}
{{- end }}true
{{- end }}
{{- end }}

{{/*
The kubelet's PodResources socket the agent reads (OMATICAYA_POD_RESOURCES_SOCKET), "" for none:
podResourcesSocket, else the kubelet's default path when the pod is the node's device plugin
(the extender then sees which GPUs and units the kubelet has handed out: without it a whole GPU
given to a pod that has not loaded its model yet looks free, and a shared GPU's units are not
counted); "off" turns it off.
*/}}
{{- define "omaticaya.podResourcesSocket" -}}
{{- $v := toString .Values.podResourcesSocket }}
{{- if eq $v "off" }}
{{- else if $v }}{{ $v }}
{{- else if .Values.devicePlugin }}/var/lib/kubelet/pod-resources/kubelet.sock
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
