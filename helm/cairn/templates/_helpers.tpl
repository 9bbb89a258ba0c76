{{/*
Chart name, truncated to 63 characters (a Kubernetes name limit).
*/}}
{{- define "cairn.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name: "<release>-<chart>", or the release name alone when it already holds the
chart name.
*/}}
{{- define "cairn.fullname" -}}
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

{{/*
"<chart>-<version>" for the helm.sh/chart label.
*/}}
{{- define "cairn.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Name of one component's resources: "<fullname>-<component>".
Call with (dict "root" $ "component" "worker").
*/}}
{{- define "cairn.componentName" -}}
{{- printf "%s-%s" (include "cairn.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels of every resource of one component.
Call with (dict "root" $ "component" "worker").
*/}}
{{- define "cairn.labels" -}}
helm.sh/chart: {{ include "cairn.chart" .root }}
{{ include "cairn.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: cairn
{{- end -}}

{{/*
Selector labels of one component; they never change after install.
Call with (dict "root" $ "component" "worker").
*/}}
{{- define "cairn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cairn.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
The image reference, "<repository>:<tag or appVersion>".
*/}}
{{- define "cairn.image" -}}
{{- $img := .Values.global.image -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}

{{/*
ServiceAccount of the long-running pods.
*/}}
{{- define "cairn.serviceAccountName" -}}
{{- if .Values.global.serviceAccount.create -}}
{{- default (include "cairn.fullname" .) .Values.global.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.global.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Name of the Secret that holds the connection URLs and the token.
*/}}
{{- define "cairn.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else -}}
{{- include "cairn.fullname" . -}}
{{- end -}}
{{- end -}}

{{/*
Name of the shared ConfigMap.
*/}}
{{- define "cairn.configName" -}}
{{- printf "%s-config" (include "cairn.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Environment variables taken from the Secret. Call with
(dict "root" $ "secretName" "name" "keys" (list "databaseUrl" "redisUrl")).
The bootstrap token is optional in the Secret.
*/}}
{{- define "cairn.secretEnv" -}}
{{- $root := .root -}}
{{- $envNames := dict "databaseUrl" "CAIRN_DATABASE_URL" "redisUrl" "CAIRN_REDIS_URL" "amqpUrl" "CAIRN_AMQP_URL" "bootstrapAdminToken" "CAIRN_BOOTSTRAP_ADMIN_TOKEN" -}}
{{- $optional := dict "bootstrapAdminToken" true -}}
{{- range .keys }}
- name: {{ get $envNames . }}
  valueFrom:
    secretKeyRef:
      name: {{ $.secretName }}
      key: {{ get $root.Values.secrets.keys . }}
      {{- if hasKey $optional . }}
      optional: true
      {{- end }}
{{- end }}
{{- end -}}

{{/*
Secret keys a long-running component reads, from the release's Secret.
Call with (dict "root" $ "keys" (list ...)).
*/}}
{{- define "cairn.runtimeSecretEnv" -}}
{{- include "cairn.secretEnv" (dict "root" .root "secretName" (include "cairn.secretName" .root) "keys" .keys) -}}
{{- end -}}

{{/*
Settings the scheduler and the worker must agree on: both declare the RabbitMQ topology
(names and the quorum queues' delivery limit) and both use the Redis keys.
*/}}
{{- define "cairn.messagingConfig" -}}
CAIRN_QUEUE_PREFIX: {{ .Values.global.queuePrefix | quote }}
CAIRN_REDIS_PREFIX: {{ .Values.global.redisPrefix | quote }}
CAIRN_DELIVERY_LIMIT: {{ int .Values.global.deliveryLimit | quote }}
{{- end -}}

{{/*
Environment variables the chart sets itself, each with the values it comes from;
global.extraConfig may not name them (it would clash with or be shadowed by them).
*/}}
{{- define "cairn.chartSetEnv" -}}
{{- dict
  "CAIRN_LOG_FORMAT" "global.logFormat"
  "CAIRN_MIGRATE" "migration.enabled"
  "CAIRN_QUEUE_PREFIX" "global.queuePrefix"
  "CAIRN_REDIS_PREFIX" "global.redisPrefix"
  "CAIRN_DELIVERY_LIMIT" "global.deliveryLimit"
  "CAIRN_LISTEN" "scheduler.port"
  "CAIRN_METRICS_LISTEN" "worker.metricsPort and reaper.metricsPort"
  "CAIRN_SWEEP_INTERVAL_SECONDS" "scheduler.sweepIntervalSeconds"
  "CAIRN_DRAIN_SECONDS" "scheduler.drainSeconds and worker.drainSeconds"
  "CAIRN_WORKER_CONCURRENCY" "worker.concurrency"
  "CAIRN_LEASE_TTL_SECONDS" "worker.leaseTtlSeconds"
  "CAIRN_KILL_GRACE_SECONDS" "worker.killGraceSeconds"
  "CAIRN_WORKSPACES_DIR" "worker.workspaces (the volume at /var/lib/cairn/workspaces)"
  "CAIRN_ARTIFACTS_URL" "worker.artifacts (the volume at /var/lib/cairn/artifacts; step output stays in a local directory, but snapshots can go to an object store with worker.snapshotStore.url)"
  "CAIRN_SNAPSHOT_STORE_URL" "worker.snapshotStore.url"
  "CAIRN_WORKSPACE_BACKEND" "worker.workspaceBackend"
  "CAIRN_WORKSPACE_PERSISTENT" "worker.workspacePersistent"
  "CAIRN_BASE_IMAGE" "worker.baseImage"
  "CAIRN_CAPTURE_EXCLUDE" "worker.captureExclude"
  "CAIRN_SANDBOX" "worker.sandbox.mode"
  "CAIRN_STEP_NETWORK" "worker.sandbox.network"
  "CAIRN_STEP_MEMORY_MB" "worker.sandbox.memoryMb"
  "CAIRN_STEP_PIDS" "worker.sandbox.pids"
  "CAIRN_STEP_CPU_SECONDS" "worker.sandbox.cpuSeconds"
  "CAIRN_STEP_OPEN_FILES" "worker.sandbox.openFiles"
  "CAIRN_PAUSE_LIMIT_SECONDS" "worker.pauseLimitSeconds"
  "CAIRN_REAPER_INTERVAL_SECONDS" "reaper.intervalSeconds"
  "CAIRN_REAPER_BATCH" "reaper.batch"
  "CAIRN_IDLE_HEAD_SECONDS" "reaper.retention.idleHeadSeconds"
  "CAIRN_RECLAIM_AFTER_SECONDS" "reaper.retention.reclaimAfterSeconds"
  "CAIRN_DESTROYED_GRACE_SECONDS" "reaper.retention.destroyedGraceSeconds"
  "CAIRN_MEMORY_CHECKPOINT_SECONDS" "reaper.retention.memoryCheckpointSeconds"
  "CAIRN_QUARANTINE_KEEP_SECONDS" "reaper.retention.quarantineKeepSeconds"
  | toJson -}}
{{- end -}}

{{/*
envFrom entry of the worker and reaper containers for the snapshot store's credentials
(worker.snapshotStore.existingSecret); renders nothing when it is empty. The reaper
deletes snapshots through the URL each one records, so it needs the workers' credentials.
*/}}
{{- define "cairn.snapshotStoreEnvFrom" -}}
{{- with .Values.worker.snapshotStore.existingSecret }}
- secretRef:
    name: {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
Pod-level security context: non-root, fixed ids, RuntimeDefault seccomp.
*/}}
{{- define "cairn.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.global.securityContext.runAsUser }}
runAsGroup: {{ .Values.global.securityContext.runAsGroup }}
fsGroup: {{ .Values.global.securityContext.fsGroup }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
Restricted container security context.
*/}}
{{- define "cairn.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.global.securityContext.runAsUser }}
runAsGroup: {{ .Values.global.securityContext.runAsGroup }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
The worker container with what the step sandbox (bubblewrap) needs: the restricted
context, except an unmasked /proc (a new /proc for each step's PID namespace) and a
seccomp profile that allows creating namespaces. No capability is added: bubblewrap
is not set-user-id; it runs in a user namespace of the pod's own (hostUsers: false).
*/}}
{{- define "cairn.sandboxSecurityContext" -}}
{{- $profile := .Values.worker.sandbox.seccompProfile }}
runAsNonRoot: true
runAsUser: {{ .Values.global.securityContext.runAsUser }}
runAsGroup: {{ .Values.global.securityContext.runAsGroup }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
procMount: Unmasked
capabilities:
  drop:
    - ALL
seccompProfile:
  type: {{ $profile.type }}
  {{- if eq $profile.type "Localhost" }}
  localhostProfile: {{ required "worker.sandbox.seccompProfile.localhostProfile is required with type Localhost" $profile.localhostProfile | quote }}
  {{- end }}
{{- end -}}

{{/*
Pod anti-affinity preset. Call with (dict "root" $ "component" "worker" "mode" "soft").
*/}}
{{- define "cairn.affinity" -}}
{{- if eq .mode "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "cairn.selectorLabels" . | nindent 14 }}
{{- else if eq .mode "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "cairn.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end -}}

{{/*
Pod spec fields shared by the long-running components: service account, pull secrets,
placement. Call with (dict "root" $ "component" "worker" "values" .Values.worker).
*/}}
{{- define "cairn.podCommon" -}}
serviceAccountName: {{ include "cairn.serviceAccountName" .root }}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .root.Values.global.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "cairn.affinity" (dict "root" .root "component" .component "mode" .values.podAntiAffinity) }}
{{- end -}}

{{/*
Pod annotations that roll the pods when the configuration they read changes.
*/}}
{{- define "cairn.configChecksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if not .Values.secrets.existingSecret }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- end -}}

{{/*
HTTP probes on /healthz (liveness) and /readyz (readiness).
Call with (dict "port" "http" "values" .Values.scheduler).
*/}}
{{- define "cairn.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: {{ .values.livenessProbe.periodSeconds }}
  timeoutSeconds: {{ .values.livenessProbe.timeoutSeconds }}
  failureThreshold: {{ .values.livenessProbe.failureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ .port }}
  periodSeconds: {{ .values.readinessProbe.periodSeconds }}
  timeoutSeconds: {{ .values.readinessProbe.timeoutSeconds }}
  failureThreshold: {{ .values.readinessProbe.failureThreshold }}
{{- end -}}

{{/*
Extra environment variables of a component.
*/}}
{{- define "cairn.extraEnv" -}}
{{- range . }}
- name: {{ .name }}
  value: {{ .value | quote }}
{{- end }}
{{- end -}}

{{/*
Checks of combinations the schema cannot express. Rendered from validate.yaml.
*/}}
{{- define "cairn.validate" -}}
{{- $v := .Values -}}
{{- if and $v.worker.keda.enabled $v.worker.autoscaling.enabled -}}
{{- fail "worker.keda.enabled and worker.autoscaling.enabled are both true: KEDA creates its own HPA for the worker Deployment, and two autoscalers would fight over its replicas. Enable only one of them." -}}
{{- end -}}
{{- if $v.secrets.existingSecret -}}
{{- range $k := list "databaseUrl" "redisUrl" "amqpUrl" "bootstrapAdminToken" "amqpManagementUrl" -}}
{{- if get $v.secrets $k -}}
{{- fail (printf "secrets.existingSecret is set, so the chart creates no Secret and secrets.%s would be ignored: put it in the existing Secret %q under key %q instead, and leave secrets.%s empty." $k $v.secrets.existingSecret (get $v.secrets.keys $k) $k) -}}
{{- end -}}
{{- end -}}
{{- else if and $v.worker.keda.enabled (not $v.secrets.amqpManagementUrl) -}}
{{- fail "worker.keda.enabled needs secrets.amqpManagementUrl: the RabbitMQ management API URL (http://user:pass@host:15672/vhost) KEDA reads the queue depth from." -}}
{{- end -}}
{{- $chartSet := include "cairn.chartSetEnv" . | fromJson -}}
{{- $secretNames := list "CAIRN_DATABASE_URL" "CAIRN_REDIS_URL" "CAIRN_AMQP_URL" "CAIRN_BOOTSTRAP_ADMIN_TOKEN" -}}
{{- /* Object store credentials (keys, secrets, tokens, SAS) come from worker.snapshotStore.existingSecret only. */ -}}
{{- $storeSecretPattern := "^(AWS|GOOGLE|AZURE)_[A-Z0-9_]*(KEY|SECRET|TOKEN|PASSWORD|SAS)" -}}
{{- $extra := list -}}
{{- range $name, $_ := $v.global.extraConfig -}}
{{- $extra = append $extra (list (printf "global.extraConfig.%s" $name) $name) -}}
{{- end -}}
{{- range $comp := list "scheduler" "worker" "reaper" -}}
{{- range (index $v $comp).extraEnv -}}
{{- $extra = append $extra (list (printf "%s.extraEnv %s" $comp .name) .name) -}}
{{- end -}}
{{- end -}}
{{- range $e := $extra -}}
{{- $where := index $e 0 -}}
{{- $name := index $e 1 -}}
{{- if has $name $secretNames -}}
{{- fail (printf "%s is a secret setting and cannot be a plain value: set it through the secrets block." $where) -}}
{{- end -}}
{{- if hasKey $chartSet $name -}}
{{- fail (printf "%s is set by the chart, from %s: use that instead." $where (get $chartSet $name)) -}}
{{- end -}}
{{- if regexMatch $storeSecretPattern $name -}}
{{- fail (printf "%s is an object store credential and cannot be a plain value: put it in a Secret named by worker.snapshotStore.existingSecret." $where) -}}
{{- end -}}
{{- end -}}
{{- $store := $v.worker.snapshotStore -}}
{{- if regexMatch "^[A-Za-z][A-Za-z0-9+.-]*://[^/]*@|[?#]" $store.url -}}
{{- fail (printf "worker.snapshotStore.url %q holds user information, a query or a fragment: it goes into a ConfigMap, so it must hold no credentials. Put the store's credentials (AWS_*, GOOGLE_*, AZURE_* variables) in a Secret named by worker.snapshotStore.existingSecret." $store.url) -}}
{{- end -}}
{{- $localStore := "" -}}
{{- if hasPrefix "file://" $store.url -}}
{{- $localStore = trimPrefix "file://" $store.url -}}
{{- else if hasPrefix "/" $store.url -}}
{{- $localStore = $store.url -}}
{{- end -}}
{{- if and $localStore (not (regexMatch "^/var/lib/cairn/artifacts(/|$)" $localStore)) -}}
{{- fail (printf "worker.snapshotStore.url %q is a local directory outside /var/lib/cairn/artifacts: the root filesystem is read-only and that volume (worker.artifacts) is the only one the chart gives for snapshots. Use a directory under it, an object store URL, or leave it empty." $store.url) -}}
{{- end -}}
{{- if and $store.existingSecret (eq $store.existingSecret (include "cairn.secretName" .)) -}}
{{- fail (printf "worker.snapshotStore.existingSecret %q is the Secret of the connection URLs: all its keys would become environment variables of the workers and the reaper. Put the object store's credentials in a Secret of their own." $store.existingSecret) -}}
{{- end -}}
{{- if ge (int $v.worker.killGraceSeconds) (int $v.worker.drainSeconds) -}}
{{- fail (printf "worker.killGraceSeconds (%d) must be less than worker.drainSeconds (%d): the worker stops running steps killGraceSeconds + 1 seconds before the end of its drain, so running steps get drainSeconds - killGraceSeconds - 1 seconds to finish." (int $v.worker.killGraceSeconds) (int $v.worker.drainSeconds)) -}}
{{- end -}}
{{- if ge (int $v.scheduler.drainSeconds) (int $v.scheduler.terminationGracePeriodSeconds) -}}
{{- fail (printf "scheduler.drainSeconds (%d) must be less than scheduler.terminationGracePeriodSeconds (%d), or Kubernetes kills the scheduler before its background work has stopped." (int $v.scheduler.drainSeconds) (int $v.scheduler.terminationGracePeriodSeconds)) -}}
{{- end -}}
{{- if and $v.scheduler.autoscaling.enabled (gt (int $v.scheduler.autoscaling.minReplicas) (int $v.scheduler.autoscaling.maxReplicas)) -}}
{{- fail "scheduler.autoscaling.minReplicas is greater than maxReplicas." -}}
{{- end -}}
{{- if and $v.worker.autoscaling.enabled (gt (int $v.worker.autoscaling.minReplicas) (int $v.worker.autoscaling.maxReplicas)) -}}
{{- fail "worker.autoscaling.minReplicas is greater than maxReplicas." -}}
{{- end -}}
{{- if and $v.worker.keda.enabled (gt (int $v.worker.keda.minReplicaCount) (int $v.worker.keda.maxReplicaCount)) -}}
{{- fail "worker.keda.minReplicaCount is greater than maxReplicaCount." -}}
{{- end -}}
{{- end -}}
