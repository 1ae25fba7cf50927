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
