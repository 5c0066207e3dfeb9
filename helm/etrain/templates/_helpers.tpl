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

{{/* "true" when the job store is PostgreSQL (in-cluster or an existing URL), "" on SQLite. */}}
{{- define "etrain.postgres" -}}
{{- if or .Values.postgresql.enabled .Values.database.existingSecret }}true{{ end }}
{{- end }}

{{/* Whether the chart runs a shared RayCluster, and whether it runs the Redis its GCS keeps
its state in (GCS fault tolerance on, and no existing Redis named). */}}
{{- define "etrain.sharedCluster" -}}
{{- if or (eq .Values.controlPlane.backend "ray-jobs") .Values.controlPlane.sharedCluster }}true{{ end }}
{{- end }}
{{- define "etrain.redis" -}}
{{- $ft := .Values.ray.gcsFaultTolerance -}}
{{- if and (include "etrain.sharedCluster" .) $ft.enabled (not $ft.redisAddress) }}true{{ end }}
{{- end }}

{{/* Replicas of the control plane: as asked on PostgreSQL; 1 on SQLite, which takes one
serving process (etrain serve refuses a second on the same file). */}}
{{- define "etrain.replicas" -}}
{{- if include "etrain.postgres" . }}{{ .Values.controlPlane.replicas }}{{ else }}1{{ end }}
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

{{/* Pod-level security of Ray pods: the `ray` user (1000:100) of the rayproject images,
the runtime's default seccomp profile (service/k8s/pod_security.py). */}}
{{- define "etrain.rayPodSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  runAsGroup: 100
  fsGroup: 100
  seccompProfile:
    type: RuntimeDefault
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end }}

{{/* Container-level security of every Ray container (and the autoscaler sidecar). */}}
{{- define "etrain.rayContainerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end }}

{{/* The folders Ray writes on a read-only root file system (emptyDirs). */}}
{{- define "etrain.rayWritableMounts" -}}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /home/ray/.cache
{{- end }}

{{/* Volumes of a Ray pod after /dev/shm: writable emptyDirs, the checkpoint claim. */}}
{{- define "etrain.rayVolumes" -}}
- name: tmp
  emptyDir: {sizeLimit: 32Gi}
- name: cache
  emptyDir: {sizeLimit: 32Gi}
{{- with include "etrain.checkpointClaim" . }}
- name: checkpoints
  persistentVolumeClaim: {claimName: {{ . }}}
{{- end }}
{{- end }}

{{/* The end of every Ray container: security, /dev/shm, writable and checkpoint mounts.
No storage Secret: the shared cluster runs every tenant's jobs. */}}
{{- define "etrain.rayContainerTail" -}}
{{ include "etrain.rayContainerSecurity" . }}
volumeMounts:
  - name: shm
    mountPath: /dev/shm
  {{- include "etrain.rayWritableMounts" . | nindent 2 }}
  {{- if include "etrain.checkpointClaim" . }}
  - name: checkpoints
    mountPath: /var/lib/etrain/checkpoints
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
