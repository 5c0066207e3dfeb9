{{/* Chart name, cut to 63 characters. */}}
{{- define "etrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix. KubeRay limits RayCluster names to 53 characters. */}}
{{- define "etrain.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 53 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 53 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 53 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object; $component is the second argument. */}}
{{- define "etrain.labels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "etrain.name" $root }}
app.kubernetes.io/component: {{ index . 1 }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Pod selector labels; $component is the second argument. */}}
{{- define "etrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "etrain.name" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* The checkpoint claim shared by the control plane and the Ray pods ("" = none). */}}
{{- define "etrain.checkpointClaim" -}}
{{- if .Values.checkpoints.create }}
{{- printf "%s-checkpoints" (include "etrain.fullname" .) }}
{{- else }}
{{- .Values.checkpoints.existingClaim }}
{{- end }}
{{- end }}

{{/* The Ray head service's dashboard URL inside the cluster. */}}
{{- define "etrain.rayDashboard" -}}
{{- printf "http://%s-head-svc.%s.svc.cluster.local:8265" (include "etrain.fullname" .) .Release.Namespace }}
{{- end }}

{{/* Prometheus scrape annotations for a pod serving metrics on $port. */}}
{{- define "etrain.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ . | quote }}
prometheus.io/path: /metrics
{{- end }}

{{/* Pod-level security of Ray pods: the `ray` user (1000:100) of the rayproject images. */}}
{{- define "etrain.rayPodSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  runAsGroup: 100
  fsGroup: 100
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end }}

{{/* The end of every Ray container: security, /dev/shm and checkpoint mounts, storage env. */}}
{{- define "etrain.rayContainerTail" -}}
securityContext:
  allowPrivilegeEscalation: false
  capabilities:
    drop: ["ALL"]
volumeMounts:
  - name: shm
    mountPath: /dev/shm
  {{- if include "etrain.checkpointClaim" . }}
  - name: checkpoints
    mountPath: /var/lib/etrain/checkpoints
  {{- end }}
{{- with .Values.checkpoints.storageSecret }}
envFrom:
  - secretRef:
      name: {{ . }}
      optional: true
{{- end }}
{{- end }}

{{/* MinIO root credentials from the existing Secret. */}}
{{- define "etrain.minioRootEnv" -}}
- name: MINIO_ROOT_USER
  valueFrom:
    secretKeyRef:
      name: {{ .Values.minio.existingSecret }}
      key: root-user
- name: MINIO_ROOT_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.minio.existingSecret }}
      key: root-password
{{- end }}
