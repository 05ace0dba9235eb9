{{/* Names, labels and the values several templates share. */}}

{{- define "spore.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "spore.fullname" -}}
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

{{- define "spore.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "spore.labels" -}}
helm.sh/chart: {{ include "spore.chart" . }}
app.kubernetes.io/name: {{ include "spore.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include with (list $ "api") or (list $ "node"). */}}
{{- define "spore.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "spore.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "spore.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "spore.apiServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-api" (include "spore.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "spore.nodeServiceAccountName" -}}
{{- printf "%s-node" (include "spore.fullname" .) -}}
{{- end -}}

{{/* The chart's own Secret (database URL, cluster token, S3 credentials it was given). */}}
{{- define "spore.secretName" -}}
{{- include "spore.fullname" . -}}
{{- end -}}

{{- define "spore.tokenSecretName" -}}
{{- default (include "spore.secretName" .) .Values.clusterToken.existingSecret -}}
{{- end -}}

{{- define "spore.tokenSecretKey" -}}
{{- if .Values.clusterToken.existingSecret -}}{{ .Values.clusterToken.existingSecretKey }}{{- else -}}cluster-token{{- end -}}
{{- end -}}

{{- define "spore.apiKeySecretName" -}}
{{- default (include "spore.secretName" .) .Values.apiKey.existingSecret -}}
{{- end -}}

{{- define "spore.apiKeySecretKey" -}}
{{- if .Values.apiKey.existingSecret -}}{{ .Values.apiKey.existingSecretKey }}{{- else -}}api-key{{- end -}}
{{- end -}}

{{- define "spore.databaseSecretName" -}}
{{- default (include "spore.secretName" .) .Values.database.existingSecret -}}
{{- end -}}

{{- define "spore.databaseSecretKey" -}}
{{- if .Values.database.existingSecret -}}{{ .Values.database.existingSecretKey }}{{- else -}}database-url{{- end -}}
{{- end -}}

{{- define "spore.s3SecretName" -}}
{{- default (include "spore.secretName" .) .Values.s3.existingSecret -}}
{{- end -}}

{{/* True (non-empty) when S3 credentials are configured one way or the other. */}}
{{- define "spore.s3Credentials" -}}
{{- if or .Values.s3.existingSecret (and .Values.s3.accessKeyId .Values.s3.secretAccessKey) -}}true{{- end -}}
{{- end -}}

{{/*
A generated secret value: the one given, else the one already in the release's Secret (so an upgrade
keeps it: running nodes stay trusted, clients keep their key), else a new random one.
Include with (list $ "key-in-secret" .Values.x.value).
*/}}
{{- define "spore.keptRandom" -}}
{{- $ := index . 0 -}}
{{- $key := index . 1 -}}
{{- $given := index . 2 -}}
{{- if $given -}}
{{- $given -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" $.Release.Namespace (include "spore.secretName" $) -}}
{{- if and $existing $existing.data (hasKey $existing.data $key) -}}
{{- index $existing.data $key | b64dec -}}
{{- else -}}
{{- randAlphaNum 48 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "spore.apiUrl" -}}
{{- if .Values.node.apiUrl -}}
{{- .Values.node.apiUrl -}}
{{- else -}}
{{- printf "http://%s-api.%s:%v" (include "spore.fullname" .) .Release.Namespace .Values.api.service.port -}}
{{- end -}}
{{- end -}}

{{/* Checks that fail the render with a message instead of installing something that cannot start. */}}
{{- define "spore.validate" -}}
{{- if not (or .Values.database.url .Values.database.existingSecret) -}}
{{- fail "database.url (postgres://...) or database.existingSecret is required: Spore's API keeps its state in PostgreSQL" -}}
{{- end -}}
{{- if and .Values.s3.endpoint (not .Values.s3.bucket) -}}
{{- fail "s3.bucket is required when s3.endpoint is set" -}}
{{- end -}}
{{- if and (or .Values.s3.accessKeyId .Values.s3.secretAccessKey) (not (and .Values.s3.accessKeyId .Values.s3.secretAccessKey)) -}}
{{- fail "s3.accessKeyId and s3.secretAccessKey go together" -}}
{{- end -}}
{{- if and .Values.clusterToken.value (lt (len .Values.clusterToken.value) 16) -}}
{{- fail "clusterToken.value must be at least 16 characters" -}}
{{- end -}}
{{- if lt (int .Values.api.replicas) 1 -}}
{{- fail "api.replicas must be at least 1" -}}
{{- end -}}
{{- end -}}

{{/* A map as k=v,k=v (sorted keys). */}}
{{- define "spore.kvList" -}}
{{- $out := list -}}
{{- range $k, $v := . -}}
{{- $out = append $out (printf "%s=%v" $k $v) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}
