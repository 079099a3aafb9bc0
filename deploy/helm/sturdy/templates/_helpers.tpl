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

{{/* The config as Sturdy reads it: values.config with listen and admin.listen from ports. */}}
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
{{- toYaml $cfg -}}
{{- end -}}
