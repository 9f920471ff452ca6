{{/* An image reference: repository:tag, the tag defaulting to v<appVersion> (what `make images` builds). */}}
{{- define "tessera.image" -}}
{{- $tag := .image.tag | default (printf "v%s" .chart.AppVersion) -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end }}

{{/* The GPU client label values as a JSON list: agent.gpuClients.values, else the GPU Operator's. */}}
{{- define "tessera.gpuClientValues" -}}
{{- $values := .Values.agent.gpuClients.values -}}
{{- if and (not $values) .Values.gpuOperator.enabled -}}
{{- $values = list "nvidia-device-plugin-daemonset" "gpu-feature-discovery" "nvidia-dcgm-exporter" -}}
{{- end -}}
{{- $values | default list | toJson -}}
{{- end }}

{{/* The node agent's service-account user name, which the fences match. */}}
{{- define "tessera.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:tessera-node-agent
{{- end }}

{{/* imagePullSecrets, when any. */}}
{{- define "tessera.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
