{{/* Names and labels. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.fullname" -}}
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

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* sluice.selector: the labels that pick one component's pods; call with (list $ "worker"). */}}
{{- define "sluice.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "sluice.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/*
sluice.workerPort: the port a worker serves /metrics, /healthz, /readyz and
/queue-depth on (SLUICE_HTTP_ADDR). One definition: the container, its
scrape annotation, the worker Service and KEDA's trigger URL must agree.
*/}}
{{- define "sluice.workerPort" -}}9090{{- end -}}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Redis. The URL in values carries no password: the password is read from the
Secret into REDIS_PASSWORD (not a SLUICE_ name, so no Sluice command sees it as
one of its variables) and Kubernetes puts it into SLUICE_REDIS_URL with
$(REDIS_PASSWORD) at container start; it never appears in a manifest.
*/}}
{{- define "sluice.redisURL" -}}
{{- if .Values.redis.url -}}
{{- .Values.redis.url -}}
{{- else if .Values.trialRedis.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "sluice.fullname" .) -}}
{{- else -}}
{{- fail "redis.url is required (redis://host:port/db or rediss://…), or set trialRedis.enabled=true for a trial Redis in the release" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.redisParts" -}}
{{- $u := urlParse (include "sluice.redisURL" .) -}}
{{- if not (has $u.scheme (list "redis" "rediss")) -}}
{{- fail (printf "redis.url %q: the scheme must be redis:// or rediss://" .Values.redis.url) -}}
{{- end -}}
{{- if contains ":" $u.userinfo -}}
{{- fail "redis.url holds a password: remove it and put it in the Secret (secrets.name) under the key named by secrets.redisPasswordKey" -}}
{{- end -}}
{{- $host := $u.host -}}
{{- if not (regexMatch ":[0-9]+$" $host) -}}{{- $host = printf "%s:6379" $host -}}{{- end -}}
{{- $db := trimPrefix "/" $u.path | default "0" -}}
{{- dict "scheme" $u.scheme "user" $u.userinfo "host" $host "db" $db | toJson -}}
{{- end -}}

{{- define "sluice.redisEnvURL" -}}
{{- $p := include "sluice.redisParts" . | fromJson -}}
{{- $auth := "" -}}
{{- if .Values.secrets.redisPasswordKey -}}
{{- $auth = printf "%s:$(REDIS_PASSWORD)@" $p.user -}}
{{- else if $p.user -}}
{{- $auth = printf "%s@" $p.user -}}
{{- end -}}
{{- printf "%s://%s%s/%s" $p.scheme $auth $p.host $p.db -}}
{{- end -}}

{{- define "sluice.secretRef" -}}
valueFrom:
  secretKeyRef:
    name: {{ index . 0 }}
    key: {{ index . 1 }}
{{- end -}}

{{/*
sluice.checkEnv refuses, in a map of extra variables, the secrets (they belong
in the Secret) and the variables the chart sets itself. Call with
(list "config.env" $map).
*/}}
{{- define "sluice.checkEnv" -}}
{{- $where := index . 0 -}}
{{- $secrets := list "SLUICE_SUBJECT_SECRET" "SLUICE_PAYLOAD_KEYS" "SLUICE_API_TOKEN_KEY" "SLUICE_API_ADMIN_TOKEN" "SLUICE_SMTP_PASSWORD" "SLUICE_SMS_AUTH_TOKEN" "SLUICE_TELNYX_API_KEY" "SLUICE_WHATSAPP_ACCESS_TOKEN" "SLUICE_REDIS_URL" -}}
{{- $owned := dict "SLUICE_REDIS_CLUSTER_ADDRS" "redis.clusterAddrs" "SLUICE_REDIS_CA_FILE" "redis.caSecret" "SLUICE_QUEUE" "config.queue" "SLUICE_QUEUE_SHARDS" "config.queueShards" "SLUICE_HTTP_ADDR" "the chart (:9090)" "SLUICE_API_ADDR" "the chart (:8081)" "SLUICE_SHUTDOWN_TIMEOUT" "worker.shutdownTimeoutSeconds" "SLUICE_API_SHUTDOWN_TIMEOUT" "api.shutdownTimeoutSeconds" "SLUICE_CONCURRENCY" "worker.concurrency" "SLUICE_PRIORITY_CONCURRENCY" "worker.priorityConcurrency" -}}
{{- range $k, $v := index . 1 -}}
{{- if has $k $secrets -}}
{{- fail (printf "%s.%s is a secret: never put it in values; store it in the Secret named by secrets.name and name its key in secrets.*Key (redis.url without its password)" $where $k) -}}
{{- end -}}
{{- if hasKey $owned $k -}}
{{- fail (printf "%s.%s is set by the chart from %s" $where $k (get $owned $k)) -}}
{{- end -}}
{{- if not (hasPrefix "SLUICE_" $k) -}}
{{- fail (printf "%s.%s: only SLUICE_* variables belong here" $where $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
sluice.sharedEnv: what workers and the API must agree on — Redis, the queue
layout, the subject secret and payload keys (from the same Secret), and
config.env. Both Deployments include this one template.
*/}}
{{- define "sluice.sharedEnv" -}}
{{- $s := .Values.secrets -}}
{{- include "sluice.checkEnv" (list "config.env" .Values.config.env) -}}
{{- if $s.redisPasswordKey }}
- name: REDIS_PASSWORD
  {{- include "sluice.secretRef" (list $s.name $s.redisPasswordKey) | nindent 2 }}
{{- end }}
- name: SLUICE_REDIS_URL
  value: {{ include "sluice.redisEnvURL" . | quote }}
{{- with .Values.redis.clusterAddrs }}
- name: SLUICE_REDIS_CLUSTER_ADDRS
  value: {{ join "," . | quote }}
{{- end }}
{{- if .Values.redis.caSecret }}
- name: SLUICE_REDIS_CA_FILE
  value: /etc/sluice/redis-ca/{{ .Values.redis.caSecretKey }}
{{- end }}
- name: SLUICE_QUEUE
  value: {{ .Values.config.queue | quote }}
- name: SLUICE_QUEUE_SHARDS
  value: {{ .Values.config.queueShards | quote }}
- name: SLUICE_SUBJECT_SECRET
  {{- include "sluice.secretRef" (list $s.name (required "secrets.subjectSecretKey is required" $s.subjectSecretKey)) | nindent 2 }}
- name: SLUICE_PAYLOAD_KEYS
  {{- include "sluice.secretRef" (list $s.name (required "secrets.payloadKeysKey is required" $s.payloadKeysKey)) | nindent 2 }}
{{- if $s.smtpPasswordKey }}
- name: SLUICE_SMTP_PASSWORD
  {{- include "sluice.secretRef" (list $s.name $s.smtpPasswordKey) | nindent 2 }}
{{- end }}
{{- if $s.smsAuthTokenKey }}
- name: SLUICE_SMS_AUTH_TOKEN
  {{- include "sluice.secretRef" (list $s.name $s.smsAuthTokenKey) | nindent 2 }}
{{- end }}
{{- if $s.telnyxApiKeyKey }}
- name: SLUICE_TELNYX_API_KEY
  {{- include "sluice.secretRef" (list $s.name $s.telnyxApiKeyKey) | nindent 2 }}
{{- end }}
{{- if $s.whatsappAccessTokenKey }}
- name: SLUICE_WHATSAPP_ACCESS_TOKEN
  {{- include "sluice.secretRef" (list $s.name $s.whatsappAccessTokenKey) | nindent 2 }}
{{- end }}
{{- if not (hasKey .Values.config.env "SLUICE_LOG_FORMAT") }}
- name: SLUICE_LOG_FORMAT
  value: json
{{- end }}
{{- range $k, $v := .Values.config.env }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end -}}

{{- define "sluice.extraEnv" -}}
{{- include "sluice.checkEnv" . -}}
{{- $shared := list "SLUICE_RULES" "SLUICE_COMPACT_MEMBERS" "SLUICE_DEDUPE_TTL" "SLUICE_DEFAULT_TZ" "SLUICE_SMS_STATUS_CALLBACK_URL" "SLUICE_SMS_SUPPRESS_CODES" "SLUICE_SMS_SUPPRESS_TTL" -}}
{{- range $k, $v := index . 1 -}}
{{- if has $k $shared -}}
{{- fail (printf "%s.%s belongs in config.env: workers and the API must agree on it" (index $ 0) $k) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := index . 1 }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end -}}

{{/* Pod-level settings both Deployments share. */}}
{{- define "sluice.podSecurity" -}}
# Kubernetes would otherwise inject <SERVICE>_PORT-style variables for every
# Service in the namespace; one named sluice-* yields SLUICE_* names, which a
# worker refuses to start with.
enableServiceLinks: false
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "sluice.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{- define "sluice.caVolume" -}}
{{- if .Values.redis.caSecret }}
volumes:
  - name: redis-ca
    secret:
      secretName: {{ .Values.redis.caSecret }}
{{- end }}
{{- end -}}

{{- define "sluice.caMount" -}}
{{- if .Values.redis.caSecret }}
volumeMounts:
  - name: redis-ca
    mountPath: /etc/sluice/redis-ca
    readOnly: true
{{- end }}
{{- end -}}

{{- define "sluice.scrapeAnnotations" -}}
{{- $ := index . 0 -}}
{{- if $.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ index . 1 | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
