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
{{- $secrets := list "SLUICE_SUBJECT_SECRET" "SLUICE_PAYLOAD_KEYS" "SLUICE_API_TOKEN_KEY" "SLUICE_API_ADMIN_TOKEN" "SLUICE_SMTP_PASSWORD" "SLUICE_SMS_AUTH_TOKEN" "SLUICE_TELNYX_API_KEY" "SLUICE_REDIS_URL" -}}
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

{{/*
The queues the workers serve (tasks.Layout.Queues), each with a KEDA trigger
name that the formula can use as an identifier.
*/}}
{{- define "sluice.queueTriggers" -}}
{{- $t := dict
  "crc" (list
    0 4129 8258 12387 16516 20645 24774 28903 33032 37161 41290 45419 49548 53677 57806 61935
    4657 528 12915 8786 21173 17044 29431 25302 37689 33560 45947 41818 54205 50076 62463 58334
    9314 13379 1056 5121 25830 29895 17572 21637 42346 46411 34088 38153 58862 62927 50604 54669
    13907 9842 5649 1584 30423 26358 22165 18100 46939 42874 38681 34616 63455 59390 55197 51132
    18628 22757 26758 30887 2112 6241 10242 14371 51660 55789 59790 63919 35144 39273 43274 47403
    23285 19156 31415 27286 6769 2640 14899 10770 56317 52188 64447 60318 39801 35672 47931 43802
    27814 31879 19684 23749 11298 15363 3168 7233 60846 64911 52716 56781 44330 48395 36200 40265
    32407 28342 24277 20212 15891 11826 7761 3696 65439 61374 57309 53244 48923 44858 40793 36728
    37256 33193 45514 41451 53516 49453 61774 57711 4224 161 12482 8419 20484 16421 28742 24679
    33721 37784 41979 46042 49981 54044 58239 62302 689 4752 8947 13010 16949 21012 25207 29270
    46570 42443 38312 34185 62830 58703 54572 50445 13538 9411 5280 1153 29798 25671 21540 17413
    42971 47098 34713 38840 59231 63358 50973 55100 9939 14066 1681 5808 26199 30326 17941 22068
    55628 51565 63758 59695 39368 35305 47498 43435 22596 18533 30726 26663 6336 2273 14466 10403
    52093 56156 60223 64286 35833 39896 43963 48026 19061 23124 27191 31254 2801 6864 10931 14994
    64814 60687 56684 52557 48554 44427 40424 36297 31782 27655 23652 19525 15522 11395 7392 3265
    61215 65342 53085 57212 44955 49082 36825 40952 28183 32310 20053 24180 11923 16050 3793 7920)
  "x4" (list
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 1 0 3 2 5 4 7 6 9 8 11 10 13 12 15 14
    2 3 0 1 6 7 4 5 10 11 8 9 14 15 12 13 3 2 1 0 7 6 5 4 11 10 9 8 15 14 13 12
    4 5 6 7 0 1 2 3 12 13 14 15 8 9 10 11 5 4 7 6 1 0 3 2 13 12 15 14 9 8 11 10
    6 7 4 5 2 3 0 1 14 15 12 13 10 11 8 9 7 6 5 4 3 2 1 0 15 14 13 12 11 10 9 8
    8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 9 8 11 10 13 12 15 14 1 0 3 2 5 4 7 6
    10 11 8 9 14 15 12 13 2 3 0 1 6 7 4 5 11 10 9 8 15 14 13 12 3 2 1 0 7 6 5 4
    12 13 14 15 8 9 10 11 4 5 6 7 0 1 2 3 13 12 15 14 9 8 11 10 5 4 7 6 1 0 3 2
    14 15 12 13 10 11 8 9 6 7 4 5 2 3 0 1 15 14 13 12 11 10 9 8 7 6 5 4 3 2 1 0)
  "codes" (dict "0" 48 "1" 49 "2" 50 "3" 51 "4" 52 "5" 53 "6" 54 "7" 55 "8" 56 "9" 57 "A" 65 "B" 66 "C" 67 "D" 68 "E" 69 "F" 70 "G" 71 "H" 72 "I" 73 "J" 74 "K" 75 "L" 76 "M" 77 "N" 78 "O" 79 "P" 80 "Q" 81 "R" 82 "S" 83 "T" 84 "U" 85 "V" 86 "W" 87 "X" 88 "Y" 89 "Z" 90 "a" 97 "b" 98 "c" 99 "d" 100 "e" 101 "f" 102 "g" 103 "h" 104 "i" 105 "j" 106 "k" 107 "l" 108 "m" 109 "n" 110 "o" 111 "p" 112 "q" 113 "r" 114 "s" 115 "t" 116 "u" 117 "v" 118 "w" 119 "x" 120 "y" 121 "z" 122 "_" 95 "-" 45 "." 46) -}}
{{- $out := list -}}
{{- $n := int $.Values.config.queueShards -}}
{{- range $lane := list "priority" "standard" "bulk" -}}
{{- range $i := until $n -}}
{{- $q := include "sluice.queueName" (dict "base" $.Values.config.queue "lane" $lane "shard" $i "shards" $n "t" $t) -}}
{{- $out = append $out (dict "name" (printf "%s_%d" $lane $i) "queue" $q "lane" $lane) -}}
{{- end -}}
{{- end -}}
{{- $out = append $out (dict "name" "legacy" "queue" $.Values.config.queue "lane" "legacy") -}}
{{- toJson $out -}}
{{- end -}}
