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

{{/*
The chart's Secrets. <fullname> is read by the API pods only: the database URL, the API key, the
secrets key, the fleet CA (certificate and key), the join token (the cluster token when insecure).
<fullname>-node holds what the node agents may read: copies of the CA certificate and the join token
(or the cluster token), and the S3 keys. Two Secrets, not one with items picked per pod: Kubernetes'
node authorizer lets a host's kubelet read every Secret a pod on that host names, whole, so a sandbox
host must never be given a pod naming the Secret that holds the CA key.
*/}}
{{- define "spore.secretName" -}}
{{- include "spore.fullname" . -}}
{{- end -}}

{{- define "spore.nodeSecretName" -}}
{{- printf "%s-node" (include "spore.fullname" .) -}}
{{- end -}}

{{/* The cluster token (fleet.insecure only): for the API pods, and for the node pods (list $ "node"). */}}
{{- define "spore.tokenSecretName" -}}
{{- $ := index . 0 -}}
{{- if $.Values.clusterToken.existingSecret -}}{{ $.Values.clusterToken.existingSecret }}
{{- else if eq (index . 1) "node" -}}{{ include "spore.nodeSecretName" $ }}
{{- else -}}{{ include "spore.secretName" $ }}{{- end -}}
{{- end -}}

{{- define "spore.tokenSecretKey" -}}
{{- if .Values.clusterToken.existingSecret -}}{{ .Values.clusterToken.existingSecretKey }}{{- else -}}cluster-token{{- end -}}
{{- end -}}

{{/* The join token, as the cluster token: (list $ "api") or (list $ "node"). */}}
{{- define "spore.joinSecretName" -}}
{{- $ := index . 0 -}}
{{- if $.Values.fleet.joinToken.existingSecret -}}{{ $.Values.fleet.joinToken.existingSecret }}
{{- else if eq (index . 1) "node" -}}{{ include "spore.nodeSecretName" $ }}
{{- else -}}{{ include "spore.secretName" $ }}{{- end -}}
{{- end -}}

{{- define "spore.joinSecretKey" -}}
{{- if .Values.fleet.joinToken.existingSecret -}}{{ .Values.fleet.joinToken.existingSecretKey }}{{- else -}}join-token{{- end -}}
{{- end -}}

{{/* The fleet CA certificate's Secret and key: (list $ "api") or (list $ "node"). */}}
{{- define "spore.caCertSource" -}}
{{- $ := index . 0 -}}
{{- $ca := $.Values.fleet.ca -}}
{{- if and (eq (index . 1) "node") $ca.nodeSecret -}}{{ $ca.nodeSecret }}/{{ $ca.nodeSecretKey }}
{{- else if $ca.existingSecret -}}{{ $ca.existingSecret }}/tls.crt
{{- else if eq (index . 1) "node" -}}{{ include "spore.nodeSecretName" $ }}/ca.crt
{{- else -}}{{ include "spore.secretName" $ }}/fleet-ca.crt{{- end -}}
{{- end -}}

{{/* The fleet CA key's Secret and key (API pods only). */}}
{{- define "spore.caKeySource" -}}
{{- if .Values.fleet.ca.existingSecret -}}{{ .Values.fleet.ca.existingSecret }}/tls.key
{{- else -}}{{ include "spore.secretName" . }}/fleet-ca.key{{- end -}}
{{- end -}}

{{- define "spore.secretsKeySecretName" -}}
{{- default (include "spore.secretName" .) .Values.secretsKey.existingSecret -}}
{{- end -}}

{{- define "spore.secretsKeySecretKey" -}}
{{- if .Values.secretsKey.existingSecret -}}{{ .Values.secretsKey.existingSecretKey }}{{- else -}}secrets-key{{- end -}}
{{- end -}}

{{/* The metrics token's Secret and key: the user's, or the role's chart Secret ((list $ "api") or (list $ "node")). */}}
{{- define "spore.metricsSecretName" -}}
{{- $ := index . 0 -}}
{{- if $.Values.metrics.token.existingSecret -}}{{ $.Values.metrics.token.existingSecret }}
{{- else if eq (index . 1) "node" -}}{{ include "spore.nodeSecretName" $ }}
{{- else -}}{{ include "spore.secretName" $ }}{{- end -}}
{{- end -}}

{{- define "spore.metricsSecretKey" -}}
{{- if .Values.metrics.token.existingSecret -}}{{ .Values.metrics.token.existingSecretKey }}{{- else -}}metrics-token{{- end -}}
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

{{/* S3 keys: in the node Secret (both workloads read them), or a Secret you manage. */}}
{{- define "spore.s3SecretName" -}}
{{- default (include "spore.nodeSecretName" .) .Values.s3.existingSecret -}}
{{- end -}}

{{/* True (non-empty) when S3 credentials are configured one way or the other. */}}
{{- define "spore.s3Credentials" -}}
{{- if or .Values.s3.existingSecret (and .Values.s3.accessKeyId .Values.s3.secretAccessKey) -}}true{{- end -}}
{{- end -}}

{{/*
A generated secret value: the one given, else the one already in the release's Secret (so an upgrade
keeps it: running nodes stay trusted, clients keep their key, sealed secrets stay readable), else a
new random one: 48 letters and digits, or with a fourth element "bytes32" 32 random bytes in base64
(the secrets key). Include with (list $ "key-in-secret" .Values.x.value [kind]).
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
{{- else if and (gt (len .) 3) (eq (index . 3) "bytes32") -}}
{{- randBytes 32 -}}
{{- else -}}
{{- randAlphaNum 48 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The fleet CA as JSON {"crt": PEM, "key": PEM}: the one already in the release's Secret (an upgrade
keeps it: a new CA would cut off every enrolled node), else a new one (ECDSA P-256, valid 10 years,
like `spore fleet ca init`'s).
*/}}
{{- define "spore.keptCA" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "spore.secretName" .) -}}
{{- if and $existing $existing.data (hasKey $existing.data "fleet-ca.crt") (hasKey $existing.data "fleet-ca.key") -}}
{{- dict "crt" (index $existing.data "fleet-ca.crt" | b64dec) "key" (index $existing.data "fleet-ca.key" | b64dec) | toJson -}}
{{- else -}}
{{- $ca := genCAWithKey "Spore fleet CA" 3650 (genPrivateKey "ecdsa") -}}
{{- dict "crt" $ca.Cert "key" $ca.Key | toJson -}}
{{- end -}}
{{- end -}}

{{/* Where node agents register: the replicas' fleet listener (TLS), or the API when insecure. */}}
{{- define "spore.apiUrl" -}}
{{- if .Values.node.apiUrl -}}
{{- .Values.node.apiUrl -}}
{{- else if .Values.fleet.insecure -}}
{{- printf "http://%s-api.%s:%v" (include "spore.fullname" .) .Release.Namespace .Values.api.service.port -}}
{{- else -}}
{{- printf "https://%s-fleet.%s:%v" (include "spore.fullname" .) .Release.Namespace .Values.fleet.port -}}
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
{{- if and .Values.fleet.joinToken.value (lt (len .Values.fleet.joinToken.value) 16) -}}
{{- fail "fleet.joinToken.value must be at least 16 characters" -}}
{{- end -}}
{{- if and .Values.metrics.token.value (lt (len .Values.metrics.token.value) 16) -}}
{{- fail "metrics.token.value must be at least 16 characters" -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled (the node agents' metrics and the token)" -}}
{{- end -}}
{{- if and .Values.metrics.enabled (or (eq (int .Values.metrics.nodePort) (int .Values.node.port)) (eq (int .Values.metrics.nodePort) (int .Values.api.port))) -}}
{{- fail "metrics.nodePort must differ from node.port and api.port" -}}
{{- end -}}
{{- if and .Values.secretsKey.value (ne (len (b64dec .Values.secretsKey.value)) 32) -}}
{{- fail "secretsKey.value must be 32 bytes in base64 (head -c 32 /dev/urandom | base64)" -}}
{{- end -}}
{{- if and .Values.fleet.ca.nodeSecret (not .Values.fleet.ca.existingSecret) -}}
{{- fail "fleet.ca.nodeSecret goes with fleet.ca.existingSecret (the chart's own CA needs no other Secret)" -}}
{{- end -}}
{{- if and (not .Values.fleet.insecure) (eq (int .Values.fleet.port) (int .Values.api.port)) -}}
{{- fail "fleet.port and api.port must differ: the fleet listener (TLS) and the API are two listeners" -}}
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
