{{/*
Labels Helm adds to every object's metadata (not to selectors or pod
templates: a DaemonSet's selector cannot change on upgrade).
*/}}
{{- define "lanekit.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The agent image, repository:tag (tag defaults to the appVersion). */}}
{{- define "lanekit.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The image fields of a container running the agent image. */}}
{{- define "lanekit.imageFields" -}}
image: {{ include "lanekit.image" . }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* The KubeVirt hook sidecar image. */}}
{{- define "lanekit.sidecarImage" -}}
{{ .Values.kubevirt.sidecarImage.repository }}:{{ .Values.kubevirt.sidecarImage.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The agent's socket: the conflists' agentSocket and lanekitd --socket. */}}
{{- define "lanekit.socket" -}}
/run/lanekit/agent.sock
{{- end }}

{{/*
The KubeVirt CR merge patch that registers the lanekit network binding
(deploy/kubevirt/binding-patch.yaml documents each field), as JSON.
*/}}
{{- define "lanekit.bindingPatch" -}}
{{- $binding := dict
  "sidecarImage" (include "lanekit.sidecarImage" .)
  "downwardAPI" "device-info"
  "computeResourceOverhead" (dict "requests" (dict "memory" "64Mi"))
  "migration" (dict) -}}
{{- dict "spec" (dict "configuration" (dict "network" (dict "binding" (dict "lanekit" $binding)))) | toJson -}}
{{- end }}
