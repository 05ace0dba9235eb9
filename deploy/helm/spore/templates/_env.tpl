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

{{/* The cluster token as the file /etc/spore/token. */}}
{{- define "spore.tokenVolume" -}}
- name: cluster-token
  secret:
    secretName: {{ include "spore.tokenSecretName" . }}
    defaultMode: 0440
    items:
      - key: {{ include "spore.tokenSecretKey" . }}
        path: token
{{- end -}}

{{/* Pod annotations that roll the pods when their configuration changes. */}}
{{- define "spore.checksums" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print $.Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end -}}
