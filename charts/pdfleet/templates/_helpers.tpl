{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "pdfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name prefix: fullnameOverride, else the release name when it contains the chart name, else both. */}}
{{- define "pdfleet.fullname" -}}
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

{{/* Labels of the operator's own objects. The component is "operator", so they never match a fleet's pods. */}}
{{- define "pdfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "pdfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "pdfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdfleet.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "pdfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pdfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pdfleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Kopf peering is on with more than one replica (so they never both act) or when forced. */}}
{{- define "pdfleet.peering" -}}
{{- if or (gt (int .Values.operator.replicas) 1) .Values.operator.peering.enabled -}}true{{- end -}}
{{- end -}}

{{/* Labels of the monitoring objects: the chart's plus the user's selector labels. */}}
{{- define "pdfleet.monitoringLabels" -}}
{{ include "pdfleet.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* namespaceSelector of the fleet PodMonitors. */}}
{{- define "pdfleet.monitoredNamespaces" -}}
namespaceSelector:
{{- if .Values.monitoring.namespaces }}
  matchNames: {{- toYaml .Values.monitoring.namespaces | nindent 4 }}
{{- else }}
  any: true
{{- end }}
{{- end -}}
