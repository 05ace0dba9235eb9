{{/* Environment both workloads share: S3 credentials. */}}
{{- define "spore.sharedEnv" -}}
{{- if include "spore.s3Credentials" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "spore.s3SecretName" . }}
      key: {{ .Values.s3.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "spore.s3SecretName" . }}
      key: {{ .Values.s3.secretAccessKeyKey }}
{{- end }}
{{- end -}}

{{/*
The files a pod reads under /etc/spore, each projected from one Secret key. API pods: the API key,
the secrets key, the fleet CA certificate and key, the join token. Node pods: the CA certificate and
the join token, from Secrets holding nothing else of the API's (see spore.secretName). With
fleet.insecure: the cluster token instead of the fleet files. Modes: 0440, group-readable for the API
pods' fsGroup; the CA key 0400 (with an fsGroup the kubelet still adds group read to every file of
the volume). Include with (list $ "api") or (list $ "node").
*/}}
{{- define "spore.secretsVolume" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
- name: secrets
  projected:
    defaultMode: 0440
    sources:
      {{- if $.Values.fleet.insecure }}
      {{- include "spore.secretFile" (list (printf "%s/%s" (include "spore.tokenSecretName" (list $ $role)) (include "spore.tokenSecretKey" $)) "token") | nindent 6 }}
      {{- else }}
      {{- include "spore.secretFile" (list (include "spore.caCertSource" (list $ $role)) "ca.crt") | nindent 6 }}
      {{- if eq $role "api" }}
      {{- include "spore.secretFile" (list (include "spore.caKeySource" $) "ca.key" "0400") | nindent 6 }}
      {{- end }}
      {{- include "spore.secretFile" (list (printf "%s/%s" (include "spore.joinSecretName" (list $ $role)) (include "spore.joinSecretKey" $)) "join-token") | nindent 6 }}
      {{- end }}
      {{- if eq $role "api" }}
      {{- include "spore.secretFile" (list (printf "%s/%s" (include "spore.apiKeySecretName" $) (include "spore.apiKeySecretKey" $)) "api-key") | nindent 6 }}
      {{- include "spore.secretFile" (list (printf "%s/%s" (include "spore.secretsKeySecretName" $) (include "spore.secretsKeySecretKey" $)) "secrets-key") | nindent 6 }}
      {{- end }}
      {{- if $.Values.metrics.enabled }}
      {{- include "spore.secretFile" (list (printf "%s/%s" (include "spore.metricsSecretName" (list $ $role)) (include "spore.metricsSecretKey" $)) "metrics-token") | nindent 6 }}
      {{- end }}
{{- end -}}

{{/* One projected file: (list "secret/key" "path" ["mode"]). */}}
{{- define "spore.secretFile" -}}
{{- $src := splitn "/" 2 (index . 0) -}}
- secret:
    name: {{ $src._0 }}
    items:
      - key: {{ $src._1 }}
        path: {{ index . 1 }}
        {{- if gt (len .) 2 }}
        mode: {{ index . 2 }}
        {{- end }}
{{- end -}}

{{/* Pod annotations that roll the pods when their configuration changes. */}}
{{- define "spore.checksums" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print $.Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end -}}

{{/* The s3 values as a --blob-store URL: s3://bucket?endpoint=...&region=...&path-style=... */}}
{{- define "spore.blobStoreURL" -}}
{{- $q := list -}}
{{- with .Values.s3.endpoint }}{{ $q = append $q (printf "endpoint=%s" (. | urlquery)) }}{{ end -}}
{{- with .Values.s3.region }}{{ $q = append $q (printf "region=%s" (. | urlquery)) }}{{ end -}}
{{- $q = append $q (printf "path-style=%t" .Values.s3.forcePathStyle) -}}
s3://{{ .Values.s3.bucket }}?{{ join "&" $q }}
{{- end -}}
