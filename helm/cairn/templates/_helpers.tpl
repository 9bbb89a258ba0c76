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
A generated name: the full name, cut to leave room for "-<suffix>", then the suffix. The
suffix is never cut, so no name exceeds 63 characters and resources with different
suffixes never share a name, however long the release name or fullnameOverride.
Call with (dict "root" $ "suffix" "worker-metrics").
*/}}
{{- define "cairn.resourceName" -}}
{{- $base := include "cairn.fullname" .root | trunc (int (sub 62 (len .suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base .suffix -}}
{{- end -}}

{{/*
Name of one component's resources: "<fullname>-<component>", cut as cairn.resourceName.
Call with (dict "root" $ "component" "worker").
*/}}
{{- define "cairn.componentName" -}}
{{- include "cairn.resourceName" (dict "root" .root "suffix" .component) -}}
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
The image reference: "[<imageRegistry>/]<repository>" then "@<digest>" when a digest is
set (it pins the exact image, so the tag is left out), else ":<tag or appVersion>".
*/}}
{{- define "cairn.image" -}}
{{- $img := .Values.global.image -}}
{{- $repo := $img.repository -}}
{{- with .Values.global.imageRegistry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo -}}
{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
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
{{- include "cairn.resourceName" (dict "root" . "suffix" "config") -}}
{{- end -}}

{{/*
The keys of the connection Secret each workload reads, as a JSON list of names under
secrets.keys. Every component reads the database URL; the scheduler and the workers the
Redis and AMQP URLs; the scheduler alone the bootstrap token; the migration Job only the
database URL.
*/}}
{{- define "cairn.secretKeysOf" -}}
{{- $keys := dict
  "scheduler" (list "databaseUrl" "redisUrl" "amqpUrl" "bootstrapAdminToken")
  "worker" (list "databaseUrl" "redisUrl" "amqpUrl")
  "reaper" (list "databaseUrl")
  "migration" (list "databaseUrl") -}}
{{- get $keys . | toJson -}}
{{- end -}}

{{/*
Where the connection secrets are mounted, and each one's file name and variable. The
binaries read "<VARIABLE>_FILE", the path of a file that holds the value, so the values
are never in the environment (nor in /proc/<pid>/environ).
*/}}
{{- define "cairn.secretDir" -}}/var/run/secrets/cairn{{- end -}}
{{- define "cairn.secretFiles" -}}
{{- dict
  "databaseUrl" (list "database-url" "CAIRN_DATABASE_URL")
  "redisUrl" (list "redis-url" "CAIRN_REDIS_URL")
  "amqpUrl" (list "amqp-url" "CAIRN_AMQP_URL")
  "bootstrapAdminToken" (list "bootstrap-admin-token" "CAIRN_BOOTSTRAP_ADMIN_TOKEN")
  | toJson -}}
{{- end -}}

{{/*
The "<VARIABLE>_FILE" environment variables of a workload. Call with
(dict "root" $ "workload" "worker").
*/}}
{{- define "cairn.secretFileEnv" -}}
{{- $files := include "cairn.secretFiles" .root | fromJson -}}
{{- $dir := include "cairn.secretDir" .root -}}
{{- range include "cairn.secretKeysOf" .workload | fromJsonArray }}
{{- $f := get $files . }}
- name: {{ index $f 1 }}_FILE
  value: {{ printf "%s/%s" $dir (index $f 0) | quote }}
{{- end }}
{{- end -}}

{{/*
The read-only mount of the secret files.
*/}}
{{- define "cairn.secretVolumeMount" -}}
- name: secrets
  mountPath: {{ include "cairn.secretDir" . }}
  readOnly: true
{{- end -}}

{{/*
The projected volume with only the keys a workload reads. The bootstrap token is its own
source, optional: a Secret without that key gives no file, and no file means no token.
defaultMode 0440 (288): readable by the owner and the pod's fsGroup, which the processes
run in, and nobody else. Call with (dict "root" $ "workload" "worker"), and "secret" to
read another Secret with the same keys (the migration hook's).
*/}}
{{- define "cairn.secretVolume" -}}
{{- $root := .root -}}
{{- $files := include "cairn.secretFiles" $root | fromJson -}}
{{- $name := .secret | default (include "cairn.secretName" $root) -}}
{{- $required := list -}}
{{- $optional := list -}}
{{- range include "cairn.secretKeysOf" .workload | fromJsonArray -}}
{{- if eq . "bootstrapAdminToken" -}}
{{- $optional = append $optional . -}}
{{- else -}}
{{- $required = append $required . -}}
{{- end -}}
{{- end -}}
- name: secrets
  projected:
    defaultMode: 288
    sources:
      - secret:
          name: {{ $name | quote }}
          items:
            {{- range $required }}
            - key: {{ get $root.Values.secrets.keys . | quote }}
              path: {{ index (get $files .) 0 }}
            {{- end }}
      {{- range $optional }}
      - secret:
          name: {{ $name | quote }}
          optional: true
          items:
            - key: {{ get $root.Values.secrets.keys . | quote }}
              path: {{ index (get $files .) 0 }}
      {{- end }}
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
The data of each ConfigMap, one helper per ConfigMap, so that each Deployment hashes only
the ones it reads (cairn.configChecksums): a reaper setting does not roll the workers.
Every component migrates at start (CAIRN_MIGRATE=true): migrations are serialized on a
PostgreSQL advisory lock and do nothing when the schema is up to date. This is what
migrates a first install; on upgrades the pre-upgrade hook has migrated already.
*/}}
{{- define "cairn.sharedConfigData" -}}
CAIRN_LOG_FORMAT: {{ .Values.global.logFormat | quote }}
CAIRN_MIGRATE: "true"
{{- range $name, $value := .Values.global.extraConfig }}
{{ $name }}: {{ $value | quote }}
{{- end }}
{{- end -}}

{{- define "cairn.schedulerConfigData" -}}
{{ include "cairn.messagingConfig" . }}
CAIRN_SWEEP_INTERVAL_SECONDS: {{ .Values.scheduler.sweepIntervalSeconds | toString | quote }}
CAIRN_DRAIN_SECONDS: {{ int .Values.scheduler.drainSeconds | quote }}
{{- end -}}

{{/*
The snapshot store's URL as the workers get it: worker.snapshotStore.url, else the
bundled object store's bucket when it is installed, else empty (the artifacts directory).
*/}}
{{- define "cairn.snapshotStoreUrl" -}}
{{- if .Values.worker.snapshotStore.url -}}
{{- .Values.worker.snapshotStore.url -}}
{{- else if .Values.objectStore.bundled.enabled -}}
s3://{{ .Values.objectStore.bundled.bucket }}
{{- end -}}
{{- end -}}

{{- /* The bundled object store's Service, and its Secret of credentials. */}}
{{- define "cairn.objectStoreName" -}}
{{- include "cairn.componentName" (dict "root" . "component" "object-store") -}}
{{- end -}}
{{- define "cairn.objectStoreSecret" -}}
{{- .Values.objectStore.bundled.existingSecret | default (include "cairn.objectStoreName" .) -}}
{{- end -}}

{{/*
The object store's settings for a container that reads or writes snapshots and output
(the workers, the scheduler, the reaper): with the bundled store, its endpoint inside
the cluster and its one identity, from its Secret; otherwise the keys of
worker.snapshotStore.existingSecret, all of them, as environment variables.
*/}}
{{- define "cairn.objectStoreEnv" -}}
{{- if and .Values.objectStore.bundled.enabled (not .Values.worker.snapshotStore.url) }}
- name: AWS_ENDPOINT
  value: {{ printf "http://%s:%d" (include "cairn.objectStoreName" .) (int .Values.objectStore.bundled.port) | quote }}
{{- /* Plain HTTP inside the cluster, to a Service of the release itself. */}}
- name: AWS_ALLOW_HTTP
  value: "true"
- name: AWS_REGION
  value: "us-east-1"
{{- range $key := list "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" }}
- name: {{ $key }}
  valueFrom:
    secretKeyRef:
      name: {{ include "cairn.objectStoreSecret" $ }}
      key: {{ $key }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
"true" when every worker can restore every other worker's snapshots: they all mount one
artifacts claim (worker.artifacts.existingClaim), or the snapshots go to an object store
(worker.snapshotStore.url with a scheme other than file://, as the binary decides).
Otherwise "false": each worker's snapshots are on its own emptyDir. It decides what a
draining worker does (CAIRN_SNAPSHOTS_SHARED), and whether an autoscaler is allowed.
*/}}
{{- define "cairn.snapshotsShared" -}}
{{- $w := .Values.worker -}}
{{- if or $w.artifacts.existingClaim (regexMatch "^(s3|gs|az|azure|abfs|abfss)://" (include "cairn.snapshotStoreUrl" .)) -}}
true
{{- else -}}
false
{{- end -}}
{{- end -}}

{{- define "cairn.workerConfigData" -}}
{{- $w := .Values.worker -}}
{{ include "cairn.messagingConfig" . }}
CAIRN_WORKER_CONCURRENCY: {{ int $w.concurrency | quote }}
CAIRN_SANDBOX_SLOTS: {{ int $w.sandboxSlots | quote }}
{{- with $w.prefetch }}
CAIRN_PREFETCH: {{ int . | quote }}
{{- end }}
CAIRN_LEASE_TTL_SECONDS: {{ int $w.leaseTtlSeconds | quote }}
CAIRN_DRAIN_SECONDS: {{ int $w.drainSeconds | quote }}
CAIRN_KILL_GRACE_SECONDS: {{ int $w.killGraceSeconds | quote }}
CAIRN_WORKSPACE_BACKEND: {{ $w.workspaceBackend | quote }}
CAIRN_WORKSPACE_PERSISTENT: {{ $w.workspacePersistent | toString | quote }}
{{- with $w.baseImage }}
CAIRN_BASE_IMAGE: {{ . | quote }}
{{- end }}
{{- with $w.captureExclude }}
CAIRN_CAPTURE_EXCLUDE: {{ join "," . | quote }}
{{- end }}
CAIRN_SANDBOX: {{ $w.sandbox.mode | quote }}
CAIRN_STEP_NETWORK: {{ $w.sandbox.network | toString | quote }}
CAIRN_STEP_MEMORY_MB: {{ int $w.sandbox.memoryMb | quote }}
CAIRN_STEP_PIDS: {{ int $w.sandbox.pids | quote }}
CAIRN_STEP_CPU_SECONDS: {{ int $w.sandbox.cpuSeconds | quote }}
CAIRN_STEP_OPEN_FILES: {{ int $w.sandbox.openFiles | quote }}
CAIRN_DISK_QUOTA: {{ $w.disk.quota | quote }}
CAIRN_RUN_DISK_MB: {{ int $w.disk.runMb | quote }}
CAIRN_PAUSE_LIMIT_SECONDS: {{ int $w.pauseLimitSeconds | quote }}
{{- /* Not a secret: the store's credentials come from a Secret (cairn.objectStoreEnv). */}}
{{- with include "cairn.snapshotStoreUrl" . }}
CAIRN_SNAPSHOT_STORE_URL: {{ . | quote }}
{{- end }}
{{- /*
Always rendered: the binary's own default is true only for an object store, so a shared
claim would otherwise count as local. True: a draining worker hands each run back at its
next step boundary; false: it lets its runs go on within drainSeconds.
*/}}
CAIRN_SNAPSHOTS_SHARED: {{ include "cairn.snapshotsShared" . | quote }}
{{- end -}}

{{- define "cairn.reaperConfigData" -}}
{{- $r := .Values.reaper -}}
CAIRN_DRAIN_SECONDS: {{ int $r.drainSeconds | quote }}
CAIRN_REAPER_INTERVAL_SECONDS: {{ $r.intervalSeconds | toString | quote }}
CAIRN_REAPER_BATCH: {{ int64 $r.batch | quote }}
CAIRN_IDLE_HEAD_SECONDS: {{ int64 $r.retention.idleHeadSeconds | quote }}
CAIRN_RECLAIM_AFTER_SECONDS: {{ int64 $r.retention.reclaimAfterSeconds | quote }}
CAIRN_DESTROYED_GRACE_SECONDS: {{ int64 $r.retention.destroyedGraceSeconds | quote }}
CAIRN_MEMORY_CHECKPOINT_SECONDS: {{ int64 $r.retention.memoryCheckpointSeconds | quote }}
CAIRN_QUARANTINE_KEEP_SECONDS: {{ int64 $r.retention.quarantineKeepSeconds | quote }}
{{- end -}}

{{/*
Environment variables the chart sets itself, each with the values it comes from;
global.extraConfig and the extraEnv lists may not name them (they would clash with or
be shadowed by them).
*/}}
{{- define "cairn.chartSetEnv" -}}
{{- $files := "the secrets block (mounted as files under /var/run/secrets/cairn)" -}}
{{- dict
  "CAIRN_LOG_FORMAT" "global.logFormat"
  "CAIRN_MIGRATE" "the chart (always true: every component migrates at start, serialized on an advisory lock)"
  "CAIRN_QUEUE_PREFIX" "global.queuePrefix"
  "CAIRN_REDIS_PREFIX" "global.redisPrefix"
  "CAIRN_DELIVERY_LIMIT" "global.deliveryLimit"
  "CAIRN_LISTEN" "scheduler.port"
  "CAIRN_METRICS_LISTEN" "worker.metricsPort and reaper.metricsPort"
  "CAIRN_SWEEP_INTERVAL_SECONDS" "scheduler.sweepIntervalSeconds"
  "CAIRN_DRAIN_SECONDS" "scheduler.drainSeconds, worker.drainSeconds and reaper.drainSeconds"
  "CAIRN_WORKER_CONCURRENCY" "worker.concurrency"
  "CAIRN_SANDBOX_SLOTS" "worker.sandboxSlots"
  "CAIRN_PREFETCH" "worker.prefetch"
  "CAIRN_LEASE_TTL_SECONDS" "worker.leaseTtlSeconds"
  "CAIRN_KILL_GRACE_SECONDS" "worker.killGraceSeconds"
  "CAIRN_WORKSPACES_DIR" "worker.workspaces (the volume at /var/lib/cairn/workspaces)"
  "CAIRN_ARTIFACTS_URL" "worker.artifacts (the volume at /var/lib/cairn/artifacts; step output stays in a local directory, but snapshots can go to an object store with worker.snapshotStore.url)"
  "CAIRN_SNAPSHOT_STORE_URL" "worker.snapshotStore.url"
  "CAIRN_SNAPSHOTS_SHARED" "worker.artifacts.existingClaim and worker.snapshotStore.url (true with a shared artifacts claim or an object store URL, false otherwise)"
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
  "CAIRN_DISK_QUOTA" "worker.disk.quota"
  "CAIRN_RUN_DISK_MB" "worker.disk.runMb"
  "CAIRN_PAUSE_LIMIT_SECONDS" "worker.pauseLimitSeconds"
  "CAIRN_REAPER_INTERVAL_SECONDS" "reaper.intervalSeconds"
  "CAIRN_REAPER_BATCH" "reaper.batch"
  "CAIRN_IDLE_HEAD_SECONDS" "reaper.retention.idleHeadSeconds"
  "CAIRN_RECLAIM_AFTER_SECONDS" "reaper.retention.reclaimAfterSeconds"
  "CAIRN_DESTROYED_GRACE_SECONDS" "reaper.retention.destroyedGraceSeconds"
  "CAIRN_MEMORY_CHECKPOINT_SECONDS" "reaper.retention.memoryCheckpointSeconds"
  "CAIRN_QUARANTINE_KEEP_SECONDS" "reaper.retention.quarantineKeepSeconds"
  "CAIRN_DATABASE_URL_FILE" $files
  "CAIRN_REDIS_URL_FILE" $files
  "CAIRN_AMQP_URL_FILE" $files
  "CAIRN_BOOTSTRAP_ADMIN_TOKEN_FILE" $files
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
Placement: <component>.affinity when set (it replaces the preset), else the
podAntiAffinity preset. Call with (dict "root" $ "component" "worker" "values" $v).
*/}}
{{- define "cairn.affinity" -}}
{{- $mode := .values.podAntiAffinity -}}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if eq $mode "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "cairn.selectorLabels" . | nindent 14 }}
{{- else if eq $mode "hard" }}
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
topologySpreadConstraints; a constraint without a labelSelector gets the component's
selector labels, so it spreads this component's pods and no others.
*/}}
{{- define "cairn.topologySpread" -}}
{{- $root := .root -}}
{{- $component := .component -}}
{{- with .values.topologySpreadConstraints }}
{{- $constraints := list }}
{{- range . }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "cairn.selectorLabels" (dict "root" $root "component" $component) | fromYaml)) }}
{{- end }}
{{- $constraints = append $constraints $c }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $constraints | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
Pod spec fields shared by the long-running components: service account, pull secrets,
placement, priority. Call with (dict "root" $ "component" "worker" "values" .Values.worker).
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
{{- with .values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "cairn.affinity" . }}
{{- include "cairn.topologySpread" . }}
{{- end -}}

{{/*
Pod annotations that roll a component's pods when the configuration it reads changes,
and only then: the shared ConfigMap's data, its own ConfigMap's data and, when the chart
creates the Secret, the keys of it the component reads. A change to another component's
settings leaves these pods alone. Call with (dict "root" $ "component" "worker").
*/}}
{{- define "cairn.configChecksums" -}}
{{- $root := .root -}}
checksum/config-shared: {{ include "cairn.sharedConfigData" $root | sha256sum }}
checksum/config: {{ include (printf "cairn.%sConfigData" .component) $root | sha256sum }}
{{- if not $root.Values.secrets.existingSecret }}
{{- $read := list }}
{{- range include "cairn.secretKeysOf" .component | fromJsonArray }}
{{- $read = append $read (printf "%s=%s" (get $root.Values.secrets.keys .) (get $root.Values.secrets . | default "")) }}
{{- end }}
checksum/secret: {{ join "\n" $read | sha256sum }}
{{- end }}
{{- end -}}

{{/*
Probes. The startup probe holds the others off while a process waits for PostgreSQL or
runs migrations (its listener binds only after that): the scheduler's and the reaper's on
/readyz (they are ready once PostgreSQL answers), the worker's on /healthz (it is ready
once started). Liveness on /healthz restarts a stuck process; readiness on /readyz.
Call with (dict "port" "http" "values" .Values.scheduler "startupPath" "/readyz").
*/}}
{{- define "cairn.probes" -}}
startupProbe:
  httpGet:
    path: {{ .startupPath }}
    port: {{ .port }}
  periodSeconds: {{ .values.startupProbe.periodSeconds }}
  timeoutSeconds: {{ .values.startupProbe.timeoutSeconds }}
  failureThreshold: {{ .values.startupProbe.failureThreshold }}
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
Extra environment variables of a component: each with a plain value or a valueFrom.
*/}}
{{- define "cairn.extraEnv" -}}
{{- range . }}
- name: {{ .name }}
  {{- if hasKey . "valueFrom" }}
  valueFrom:
    {{- toYaml .valueFrom | nindent 4 }}
  {{- else }}
  value: {{ .value | quote }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
Extra volume mounts and volumes of a component (rendered after the chart's own).
*/}}
{{- define "cairn.extraVolumeMounts" -}}
{{- with .extraVolumeMounts }}
{{- toYaml . }}
{{- end }}
{{- end -}}
{{- define "cairn.extraVolumes" -}}
{{- with .extraVolumes }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{/*
Checks of combinations the schema cannot express. Rendered from validate.yaml.
*/}}
{{- define "cairn.validate" -}}
{{- $v := .Values -}}
{{- /* Every problem is collected, then all are reported in one failure. */ -}}
{{- $errors := list -}}
{{- if and $v.objectStore.bundled.enabled $v.worker.snapshotStore.url -}}
{{- $errors = append $errors (printf "objectStore.bundled.enabled is true but worker.snapshotStore.url is set (%q): the workers would use that store and the bundled one would hold nothing. Set objectStore.bundled.enabled to false, or leave worker.snapshotStore.url empty to use the bundled store." $v.worker.snapshotStore.url) -}}
{{- end -}}
{{- if and (ne (include "cairn.snapshotsShared" .) "true") (gt (int $v.worker.replicas) 1) (not (or $v.worker.keda.enabled $v.worker.autoscaling.enabled)) -}}
{{- $errors = append $errors (printf "worker.replicas is %d but the workers' artifacts are pod-local: each worker would keep its snapshots and step output on its own emptyDir, so a run's logs could not be read once its worker is gone, a run could not move to another worker, and the reaper could not reclaim them. Use the bundled object store (objectStore.bundled.enabled), an object store URL in worker.snapshotStore.url, or a ReadWriteMany claim in worker.artifacts.existingClaim; or run one worker." (int $v.worker.replicas)) -}}
{{- end -}}
{{- if and $v.worker.keda.enabled $v.worker.autoscaling.enabled -}}
{{- $errors = append $errors "worker.keda.enabled and worker.autoscaling.enabled are both true: KEDA creates its own HPA for the worker Deployment, and two autoscalers would fight over its replicas. Enable only one of them." -}}
{{- end -}}
{{- if $v.secrets.existingSecret -}}
{{- range $k := list "databaseUrl" "redisUrl" "amqpUrl" "bootstrapAdminToken" -}}
{{- if get $v.secrets $k -}}
{{- $errors = append $errors (printf "secrets.existingSecret is set, so the chart creates no Secret and secrets.%s would be ignored: put it in the existing Secret %q under key %q instead, and leave secrets.%s empty." $k $v.secrets.existingSecret (get $v.secrets.keys $k) $k) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- /* An empty URL would leave every pod in CreateContainerConfigError or crash-looping. */ -}}
{{- range $k := list "databaseUrl" "redisUrl" "amqpUrl" -}}
{{- if not (get $v.secrets $k) -}}
{{- $errors = append $errors (printf "secrets.%s is empty: the chart creates the Secret %q from secrets.databaseUrl, secrets.redisUrl and secrets.amqpUrl, and the pods cannot start without it. Set secrets.%s, or create a Secret yourself and name it in secrets.existingSecret (keys %s, %s, %s, and optionally %s)." $k (include "cairn.secretName" $) $k $v.secrets.keys.databaseUrl $v.secrets.keys.redisUrl $v.secrets.keys.amqpUrl $v.secrets.keys.bootstrapAdminToken) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $keda := $v.worker.keda -}}
{{- if and $keda.enabled (not $keda.authenticationRef) $keda.postgresql.host -}}
{{- if not (and $keda.postgresql.passwordSecret.name $keda.postgresql.passwordSecret.key) -}}
{{- $errors = append $errors "worker.keda.postgresql.host is set, so KEDA connects as a user of its own: set worker.keda.postgresql.passwordSecret.name and .key (a Secret holding the password of worker.keda.postgresql.userName), or leave host empty to use the workers' database URL from the release's Secret." -}}
{{- end -}}
{{- range $k := list "userName" "dbName" -}}
{{- if not (get $keda.postgresql $k) -}}
{{- $errors = append $errors (printf "worker.keda.postgresql.%s is required with worker.keda.postgresql.host: KEDA connects to PostgreSQL as that user to read cairn_worker_demand (or leave host empty to use the workers' database URL from the release's Secret)." $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $autoscaler := "" -}}
{{- if $keda.enabled -}}
{{- $autoscaler = "worker.keda.enabled" -}}
{{- else if $v.worker.autoscaling.enabled -}}
{{- $autoscaler = "worker.autoscaling.enabled" -}}
{{- end -}}
{{- /* Without shared snapshots a run moved off a removed worker would restart from its baseline. */ -}}
{{- if and $autoscaler (ne (include "cairn.snapshotsShared" .) "true") -}}
{{- $errors = append $errors (printf "%s is true but the workers' snapshots are not shared: an autoscaler removes busy workers, and their runs move to other workers at a step boundary, which needs a snapshot store every worker can read. Set worker.snapshotStore.url to an object store (s3://, gs:// or az://, credentials in worker.snapshotStore.existingSecret) or worker.artifacts.existingClaim to a ReadWriteMany claim." $autoscaler) -}}
{{- end -}}
{{- if and $keda.enabled (eq (int $keda.minReplicaCount) 0) (gt (int $keda.activationJobs) 0) -}}
{{- $errors = append $errors (printf "worker.keda.minReplicaCount is 0 and worker.keda.activationJobs is %d: KEDA treats a demand at or under the activation value as no demand and scales to zero after cooldownPeriod, stopping the worker of a running job and leaving queued work with no worker. Set activationJobs to 0, or minReplicaCount to 1 or more." (int $keda.activationJobs)) -}}
{{- end -}}
{{- $chartSet := include "cairn.chartSetEnv" . | fromJson -}}
{{- $secretNames := list "CAIRN_DATABASE_URL" "CAIRN_REDIS_URL" "CAIRN_AMQP_URL" "CAIRN_BOOTSTRAP_ADMIN_TOKEN" -}}
{{- /* Object store credentials (keys, secrets, tokens, SAS) come from a Secret only. */ -}}
{{- $storeSecretPattern := "^(AWS|GOOGLE|AZURE)_[A-Z0-9_]*(KEY|SECRET|TOKEN|PASSWORD|SAS)" -}}
{{- $extra := list -}}
{{- range $name, $_ := $v.global.extraConfig -}}
{{- $extra = append $extra (list (printf "global.extraConfig.%s" $name) $name false) -}}
{{- end -}}
{{- range $comp := list "scheduler" "worker" "reaper" -}}
{{- range (index $v $comp).extraEnv -}}
{{- $fromSecret := and (hasKey . "valueFrom") (hasKey .valueFrom "secretKeyRef") -}}
{{- $extra = append $extra (list (printf "%s.extraEnv %s" $comp .name) .name $fromSecret) -}}
{{- end -}}
{{- end -}}
{{- range $e := $extra -}}
{{- $where := index $e 0 -}}
{{- $name := index $e 1 -}}
{{- if eq $name "CAIRN_WORKER_ID" -}}
{{- $errors = append $errors (printf "%s sets CAIRN_WORKER_ID, a worker's lease identity: from shared configuration every worker would get the same one, take over the others' leases and lapse them at start. Leave it unset; the default, <pod name>-<pid>, is unique per worker." $where) -}}
{{- end -}}
{{- if has $name $secretNames -}}
{{- $errors = append $errors (printf "%s is a secret setting and cannot be a plain value: set it through the secrets block (the pods read it from a mounted file, %s_FILE)." $where $name) -}}
{{- end -}}
{{- if hasKey $chartSet $name -}}
{{- $errors = append $errors (printf "%s is set by the chart, from %s: use that instead." $where (get $chartSet $name)) -}}
{{- end -}}
{{- if and (regexMatch $storeSecretPattern $name) (not (index $e 2)) -}}
{{- $errors = append $errors (printf "%s is an object store credential and cannot be a plain value: put it in a Secret named by worker.snapshotStore.existingSecret (or take it with valueFrom.secretKeyRef in an extraEnv)." $where) -}}
{{- end -}}
{{- end -}}
{{- range $comp := list "scheduler" "worker" "reaper" -}}
{{- range (index $v $comp).extraVolumes -}}
{{- if has .name (list "tmp" "secrets" "workspaces" "artifacts") -}}
{{- $errors = append $errors (printf "%s.extraVolumes: the volume name %q is the chart's own; choose another name." $comp .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $store := $v.worker.snapshotStore -}}
{{- if regexMatch "^[A-Za-z][A-Za-z0-9+.-]*://[^/]*@|[?#]" $store.url -}}
{{- $errors = append $errors (printf "worker.snapshotStore.url %q holds user information, a query or a fragment: it goes into a ConfigMap, so it must hold no credentials. Put the store's credentials (AWS_*, GOOGLE_*, AZURE_* variables) in a Secret named by worker.snapshotStore.existingSecret." $store.url) -}}
{{- end -}}
{{- $localStore := "" -}}
{{- if hasPrefix "file://" $store.url -}}
{{- $localStore = trimPrefix "file://" $store.url -}}
{{- else if hasPrefix "/" $store.url -}}
{{- $localStore = $store.url -}}
{{- end -}}
{{- if and $localStore (not (regexMatch "^/var/lib/cairn/artifacts(/|$)" $localStore)) -}}
{{- $errors = append $errors (printf "worker.snapshotStore.url %q is a local directory outside /var/lib/cairn/artifacts: the root filesystem is read-only and that volume (worker.artifacts) is the only one the chart gives for snapshots. Use a directory under it, an object store URL, or leave it empty." $store.url) -}}
{{- end -}}
{{- if and $store.existingSecret (eq $store.existingSecret (include "cairn.secretName" .)) -}}
{{- $errors = append $errors (printf "worker.snapshotStore.existingSecret %q is the Secret of the connection URLs: all its keys would become environment variables of the workers and the reaper. Put the object store's credentials in a Secret of their own." $store.existingSecret) -}}
{{- end -}}
{{- if ge (int $v.worker.killGraceSeconds) (int $v.worker.drainSeconds) -}}
{{- $errors = append $errors (printf "worker.killGraceSeconds (%d) must be less than worker.drainSeconds (%d): the worker stops running steps killGraceSeconds + 1 seconds before the end of its drain, so running steps get drainSeconds - killGraceSeconds - 1 seconds to finish." (int $v.worker.killGraceSeconds) (int $v.worker.drainSeconds)) -}}
{{- end -}}
{{- if and $v.worker.sandbox.grant (eq (toString $v.worker.hostUsers) "true") -}}
{{- $errors = append $errors "worker.hostUsers is true but worker.sandbox.grant needs hostUsers: false (the step sandbox's user namespaces nest in the pod's own). Leave worker.hostUsers empty or false." -}}
{{- end -}}
{{- $s := $v.scheduler -}}
{{- if ge (add (int $s.preStopSeconds) (int $s.drainSeconds)) (int $s.terminationGracePeriodSeconds) -}}
{{- $errors = append $errors (printf "scheduler.preStopSeconds (%d) + scheduler.drainSeconds (%d) must be less than scheduler.terminationGracePeriodSeconds (%d): the grace period starts with the preStop pause, and Kubernetes kills the scheduler when it ends, before its background work has stopped." (int $s.preStopSeconds) (int $s.drainSeconds) (int $s.terminationGracePeriodSeconds)) -}}
{{- end -}}
{{- if ge (int $v.reaper.drainSeconds) (int $v.reaper.terminationGracePeriodSeconds) -}}
{{- $errors = append $errors (printf "reaper.drainSeconds (%d) must be less than reaper.terminationGracePeriodSeconds (%d), or Kubernetes kills the reaper before the sweep in flight has finished." (int $v.reaper.drainSeconds) (int $v.reaper.terminationGracePeriodSeconds)) -}}
{{- end -}}
{{- $np := $v.worker.networkPolicy -}}
{{- if and $np.enabled (not $np.egress) -}}
{{- $errors = append $errors "worker.networkPolicy.enabled with no worker.networkPolicy.egress rules: the workers could reach DNS and nothing else, not PostgreSQL, Redis, RabbitMQ or the object store, and would never start. Add the rules (see the example in values.yaml)." -}}
{{- end -}}
{{- if and $v.scheduler.autoscaling.enabled (gt (int $v.scheduler.autoscaling.minReplicas) (int $v.scheduler.autoscaling.maxReplicas)) -}}
{{- $errors = append $errors "scheduler.autoscaling.minReplicas is greater than maxReplicas." -}}
{{- end -}}
{{- if and $v.worker.autoscaling.enabled (gt (int $v.worker.autoscaling.minReplicas) (int $v.worker.autoscaling.maxReplicas)) -}}
{{- $errors = append $errors "worker.autoscaling.minReplicas is greater than maxReplicas." -}}
{{- end -}}
{{- if and $keda.enabled (gt (int $keda.minReplicaCount) (int $keda.maxReplicaCount)) -}}
{{- $errors = append $errors "worker.keda.minReplicaCount is greater than maxReplicaCount." -}}
{{- end -}}
{{- if $errors -}}
{{- fail (printf "\n%d problem(s) in the values:\n- %s" (len $errors) (join "\n- " $errors)) -}}
{{- end -}}
{{- end -}}

{{- /* The PostgreSQL connection of a KEDA trigger, when the chart gives one (else it comes
whole from the TriggerAuthentication). */}}
{{- define "cairn.kedaConnection" -}}
{{- if .host }}
host: {{ .host | quote }}
port: {{ .port | toString | quote }}
userName: {{ .userName | quote }}
dbName: {{ .dbName | quote }}
sslmode: {{ .sslmode | quote }}
{{- end }}
{{- end }}
