{{/* The release's name for every object. */}}
{{- define "sturdy.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sturdy.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sturdy.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The config as Sturdy reads it: values.config with listen and admin.listen from ports, and server.shutdown_delay
and shutdown_grace from shutdown and agent.drainSeconds. */}}
{{- define "sturdy.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- if or (hasKey $cfg "listen") (hasKey $cfg "admin_listen") -}}
{{- fail "config: leave listen and admin_listen out; the chart sets them from ports" -}}
{{- end -}}
{{- $_ := set $cfg "listen" (printf ":%v" .Values.ports.proxy) -}}
{{- $admin := deepCopy ($cfg.admin | default dict) -}}
{{- if hasKey $admin "listen" -}}
{{- fail "config.admin.listen: leave it out; the chart sets it from ports.admin" -}}
{{- end -}}
{{- $_ := set $admin "listen" (printf ":%v" .Values.ports.admin) -}}
{{- $_ := set $cfg "admin" $admin -}}
{{- $server := deepCopy ($cfg.server | default dict) -}}
{{- if or (hasKey $server "shutdown_delay") (hasKey $server "shutdown_grace") -}}
{{- fail "config.server.shutdown_delay and shutdown_grace: leave them out; the chart sets them from shutdown and agent.drainSeconds, with the pod's terminationGracePeriodSeconds" -}}
{{- end -}}
{{- $_ := set $server "shutdown_delay" (printf "%ss" (include "sturdy.shutdownDelay" .)) -}}
{{- $_ := set $server "shutdown_grace" (printf "%ds" (.Values.shutdown.graceSeconds | int)) -}}
{{- $_ := set $cfg "server" $server -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* "true" when the cluster runs native sidecars: init containers with restartPolicy Always (beta and on by
default in Kubernetes 1.29, GA in 1.33). An older API server drops the field and the pod never starts. */}}
{{- define "sturdy.nativeSidecar" -}}
{{- semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version -}}
{{- end -}}

{{/* Seconds Sturdy keeps serving after SIGTERM (server.shutdown_delay): the agent's drain beside an ordinary
sidecar container, none for a native sidecar (it gets SIGTERM after the agent has exited), the Service's
endpoint update when standalone. */}}
{{- define "sturdy.shutdownDelay" -}}
{{- if ne .Values.mode "sidecar" -}}
{{- .Values.shutdown.delaySeconds | int -}}
{{- else if eq (include "sturdy.nativeSidecar" .) "true" -}}
0
{{- else -}}
{{- .Values.agent.drainSeconds | int -}}
{{- end -}}
{{- end -}}

{{/* The pod's terminationGracePeriodSeconds: what runs after SIGTERM — the agent's drain (sidecar mode: beside
an ordinary container Sturdy's delay covers it; a native sidecar is signalled once the agent has exited) or
Sturdy's delay (standalone), then Sturdy's grace — and 10 s to spare. */}}
{{- define "sturdy.terminationGrace" -}}
{{- $before := ternary (.Values.agent.drainSeconds | int) (.Values.shutdown.delaySeconds | int) (eq .Values.mode "sidecar") -}}
{{- add $before (.Values.shutdown.graceSeconds | int) 10 -}}
{{- end -}}

{{/* Sturdy's container, as an ordinary container or a native sidecar. */}}
{{- define "sturdy.container" -}}
name: sturdy
image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
imagePullPolicy: {{ .Values.image.pullPolicy }}
args: ["-config", "/etc/sturdy/sturdy.yaml"]
{{- with .Values.envFromSecrets }}
envFrom:
  {{- range . }}
  - secretRef: {name: {{ . }}}
  {{- end }}
{{- end }}
{{- with .Values.env }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
ports:
  - {name: proxy, containerPort: {{ .Values.ports.proxy }}}
  - {name: admin, containerPort: {{ .Values.ports.admin }}}
# Started once /healthz answers: the proxy port is bound before the admin port. Never /readyz, which is
# 503 while the upstreams are down and would hold a sidecar's agent back.
startupProbe:
  httpGet: {path: /healthz, port: admin}
  periodSeconds: 1
  failureThreshold: 30
livenessProbe:
  httpGet: {path: /healthz, port: admin}
  periodSeconds: 10
{{- if .Values.readiness }}
readinessProbe:
  httpGet: {path: /readyz, port: admin}
  periodSeconds: 5
{{- end }}
resources:
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  # The whole directory, not a subPath: the kubelet updates it when the ConfigMap
  # changes, and Sturdy reloads (a subPath mount never changes).
  - {name: config, mountPath: /etc/sturdy, readOnly: true}
{{- end -}}
