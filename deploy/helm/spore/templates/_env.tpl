{{/* Environment both workloads share: the ConfigMap, S3 credentials, extra values. */}}
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

{{/* The secrets a pod reads as files under /etc/spore: the cluster token, and for the API its key. */}}
{{- define "spore.secretsVolume" -}}
{{- $ := index . 0 -}}
- name: secrets
  projected:
    defaultMode: 0440
    sources:
      - secret:
          name: {{ include "spore.tokenSecretName" $ }}
          items:
            - key: {{ include "spore.tokenSecretKey" $ }}
              path: token
      {{- if eq (index . 1) "api" }}
      - secret:
          name: {{ include "spore.apiKeySecretName" $ }}
          items:
            - key: {{ include "spore.apiKeySecretKey" $ }}
              path: api-key
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
