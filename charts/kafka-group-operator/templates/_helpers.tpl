{{/* Name of the chart, overridable. */}}
{{- define "kgo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of every resource. */}}
{{- define "kgo.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "kgo.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "kgo.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels that select the operator pod; never change them after a release. */}}
{{- define "kgo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kgo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kgo.labels" -}}
{{ include "kgo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "kgo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kgo.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kgo.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.registry }}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The headless Service: one stable DNS name per replica (<pod>.<this>.<namespace>.svc). */}}
{{- define "kgo.headlessService" -}}
{{- printf "%s-headless" (include "kgo.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The URL consumer pods use to reach the member API (any replica; a NOT_COORDINATOR
answer names the replica coordinating the group). */}}
{{- define "kgo.coordinatorUrl" -}}
{{- printf "http://%s.%s.svc:%d" (include "kgo.fullname" .) .Release.Namespace (int .Values.api.port) }}
{{- end }}

{{/* Rules for the namespaced resources the operator reads and writes. */}}
{{- define "kgo.namespacedRules" -}}
# ConsumerGroups and OffsetSnapshots: watched by kopf, patched for its annotations and
# finalizer; OffsetSnapshots are also created and pruned by snapshot schedules.
- apiGroups: [kafkagroups.io]
  resources: [consumergroups]
  verbs: [get, list, watch, patch]
- apiGroups: [kafkagroups.io]
  resources: [offsetsnapshots]
  verbs: [get, list, watch, patch, create, delete]
- apiGroups: [kafkagroups.io]
  resources: [consumergroups/status, offsetsnapshots/status]
  verbs: [get, patch]
# Children carry ownerReferences with blockOwnerDeletion; where the
# OwnerReferencesPermissionEnforcement admission plugin runs (OpenShift, hardened clusters),
# setting one needs update on the owner's finalizers, else every child is refused (403).
- apiGroups: [kafkagroups.io]
  resources: [consumergroups/finalizers, offsetsnapshots/finalizers]
  verbs: [update]
# The consumers of each group; deleted by the operator itself when the group is deleted,
# so that its pods stop (and commit) before the group's token is discarded.
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create]
{{- if or .Values.watchNamespaces (not .Values.rbac.secretNamespaces) }}
{{ include "kgo.secretRules" . }}
{{- end }}
# Pod events tell a scale-down (permanent leave) from a restart (temporary leave).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# Events for rebalances and errors (ours and kopf's).
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
# Snapshot, restore and compaction jobs.
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [get, list, watch, create, delete]
{{- end }}

{{/* kopf's peering objects (several replicas): watched, and patched with keep-alives; only
the release's own. */}}
{{- define "kgo.peeringRules" -}}
{{- $resource := ternary "kopfpeerings" "clusterkopfpeerings" (not (empty .Values.watchNamespaces)) }}
- apiGroups: [kopf.dev]
  resources: [{{ $resource }}]
  verbs: [list, watch]
- apiGroups: [kopf.dev]
  resources: [{{ $resource }}]
  verbs: [get, patch]
  resourceNames: [{{ include "kgo.fullname" . }}]
{{- end }}

{{/* Secrets: the groups' token Secrets (created once) and the Kafka Secrets they name
(checked to exist). Names are only known at run time, so RBAC cannot list them: without
watchNamespaces this is every Secret of the cluster, unless rbac.secretNamespaces narrows
it to Roles in the namespaces listed there. */}}
{{- define "kgo.secretRules" -}}
# Group token Secrets (created once) and the Kafka Secrets (checked to exist).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
{{- end }}

{{/* Refuse Lease settings whose failover does not fit the groups' shortest session timeout
(with more than one replica). The same rule as the operator's own check at start
(handlers/config.py, failover_fits): a failover takes at most the Lease, a round (a sixth of
the Lease), 2 s to fence and load and 1.2 s for the member's retry; a member surely keeps its
partitions for half its session timeout less a heartbeat interval (3 s, or a quarter of the
session when shorter); the failover must fit three quarters of that. */}}
{{- define "kgo.checkFailover" -}}
{{- if gt (int .Values.replicas) 1 }}
{{- $lease := float64 .Values.leases.durationSeconds }}
{{- $session := float64 .Values.groups.minSessionTimeoutSeconds }}
{{- $failover := addf $lease (divf $lease 6.0) 2.0 1.2 }}
{{- $budget := subf (divf $session 2.0) (minf 3.0 (divf $session 4.0)) }}
{{- if gt $failover (mulf 0.75 $budget) }}
{{- fail (printf "leases.durationSeconds=%d does not fit groups.minSessionTimeoutSeconds=%d: a failover may take %.1fs, more than three quarters of the %.1fs a member surely keeps its partitions; shorten the Lease or raise the minimum" (int .Values.leases.durationSeconds) (int .Values.groups.minSessionTimeoutSeconds) $failover $budget) }}
{{- end }}
{{- end }}
{{- end }}
