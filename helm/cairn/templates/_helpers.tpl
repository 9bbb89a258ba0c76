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
The bootstrap token and the artifacts URL are optional in the Secret.
*/}}
{{- define "cairn.secretEnv" -}}
{{- $root := .root -}}
{{- $envNames := dict "databaseUrl" "CAIRN_DATABASE_URL" "redisUrl" "CAIRN_REDIS_URL" "amqpUrl" "CAIRN_AMQP_URL" "bootstrapAdminToken" "CAIRN_BOOTSTRAP_ADMIN_TOKEN" "artifactsUrl" "CAIRN_ARTIFACTS_URL" -}}
{{- $optional := dict "bootstrapAdminToken" true "artifactsUrl" true -}}
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
Secret keys a long-running component reads. The artifacts URL comes from the Secret
only when global.artifactsUrl (ConfigMap) is empty.
Call with (dict "root" $ "keys" (list ...)).
*/}}
{{- define "cairn.runtimeSecretEnv" -}}
{{- $keys := .keys -}}
{{- if not .root.Values.global.artifactsUrl -}}
{{- $keys = append $keys "artifactsUrl" -}}
{{- end -}}
{{- include "cairn.secretEnv" (dict "root" .root "secretName" (include "cairn.secretName" .root) "keys" $keys) -}}
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
{{- range $k := list "databaseUrl" "redisUrl" "amqpUrl" "bootstrapAdminToken" "artifactsUrl" "amqpManagementUrl" -}}
{{- if get $v.secrets $k -}}
{{- fail (printf "secrets.existingSecret is set, so the chart creates no Secret and secrets.%s would be ignored: put it in the existing Secret %q under key %q instead, and leave secrets.%s empty." $k $v.secrets.existingSecret (get $v.secrets.keys $k) $k) -}}
{{- end -}}
{{- end -}}
{{- else if and $v.worker.keda.enabled (not $v.secrets.amqpManagementUrl) -}}
{{- fail "worker.keda.enabled needs secrets.amqpManagementUrl: the RabbitMQ management API URL (http://user:pass@host:15672/vhost) KEDA reads the queue depth from." -}}
{{- end -}}
{{- if and $v.global.artifactsUrl $v.secrets.artifactsUrl -}}
{{- fail "global.artifactsUrl and secrets.artifactsUrl are both set: use global.artifactsUrl for a URL without credentials, secrets.artifactsUrl for one with credentials, not both." -}}
{{- end -}}
{{- if regexMatch "^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@" $v.global.artifactsUrl -}}
{{- fail "global.artifactsUrl holds credentials (user:password@) and would land in a ConfigMap: move it to secrets.artifactsUrl." -}}
{{- end -}}
{{- range $name, $_ := $v.global.extraConfig -}}
{{- if has $name (list "CAIRN_DATABASE_URL" "CAIRN_REDIS_URL" "CAIRN_AMQP_URL" "CAIRN_BOOTSTRAP_ADMIN_TOKEN" "CAIRN_ARTIFACTS_URL") -}}
{{- fail (printf "global.extraConfig.%s is a secret setting and cannot go into a ConfigMap: set it through the secrets block." $name) -}}
{{- end -}}
{{- end -}}
{{- if and $v.worker.confinement.enabled (eq $v.worker.confinement.mode "seccompLocalhost") (not $v.worker.confinement.seccompLocalhostProfile) -}}
{{- fail "worker.confinement.mode is seccompLocalhost: set worker.confinement.seccompLocalhostProfile to the node-local seccomp profile that allows unshare." -}}
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
