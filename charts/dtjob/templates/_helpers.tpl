{{- define "dtjob.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dtjob.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "dtjob.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* An image reference as the chart writes it: global.imageRegistry, when set, replaces the registry (the first
path component when it names a host: it has a dot or a port, or is localhost) or goes in front of a reference
without one; a reference without a tag or digest gets the chart's appVersion. Call with (list $ "<ref>"). */}}
{{- define "dtjob.image" -}}
{{- $root := index . 0 -}}
{{- $ref := index . 1 -}}
{{- with ($root.Values.global | default dict).imageRegistry -}}
{{- $parts := splitList "/" $ref -}}
{{- $first := first $parts -}}
{{- $hasRegistry := and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $path := $ref -}}
{{- if $hasRegistry -}}
{{- $path = rest $parts | join "/" -}}
{{- end -}}
{{- $ref = printf "%s/%s" (trimSuffix "/" .) $path -}}
{{- end -}}
{{- if not (or (contains "@" $ref) (contains ":" (last (splitList "/" $ref)))) -}}
{{- $ref = printf "%s:%s" $ref $root.Chart.AppVersion -}}
{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* The operator's own image: repository at its digest, else at its tag (the appVersion by default). */}}
{{- define "dtjob.operatorImage" -}}
{{- $image := .Values.image -}}
{{- $ref := $image.repository -}}
{{- if $image.digest -}}
{{- $ref = printf "%s@%s" $ref $image.digest -}}
{{- else -}}
{{- $ref = printf "%s:%s" $ref ($image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- include "dtjob.image" (list . $ref) -}}
{{- end -}}

{{- define "dtjob.labels" -}}
app.kubernetes.io/name: {{ include "dtjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dtjob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dtjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "dtjob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dtjob.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Rules on namespaced objects: exactly the calls the operator makes (tests/integration/test_rbac.py checks
them against the code). Pods and Jobs are watched and listed; every child is also read by name. */}}
{{- define "dtjob.namespacedRules" -}}
# The operator watches jobs, reads one to reconcile it and deletes it after ttlSecondsAfterFinished.
- apiGroups: [dtjob.io]
  resources: [distributedtrainingjobs]
  verbs: [get, list, watch, delete]
- apiGroups: [dtjob.io]
  resources: [distributedtrainingjobs/status]
  verbs: [patch]
# Children carry a controller ownerReference with blockOwnerDeletion, which clusters running the
# OwnerReferencesPermissionEnforcement admission plugin allow only to who may update the owner's finalizers.
- apiGroups: [dtjob.io]
  resources: [distributedtrainingjobs/finalizers]
  verbs: [update]
# get (and patch): a create answered 409 AlreadyExists is followed by a read (whose is it, is it gone or
# going?) and, for the Service, ConfigMap and NetworkPolicy, a patch of the fields the operator owns. Pods:
# patch takes Kueue's finalizer off a deleted worker that has ended, so that its name can be reused.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch]
# The headless Service selects no pods: the operator publishes its own MPI hosts in the Service's EndpointSlice
# (a pod labelled alike is never among them). It deletes what Kubernetes' controllers made for a Service an
# older operator created with a selector: their slices, and the Endpoints object that would be mirrored.
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [endpoints]
  verbs: [delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
# The SSH key and SAS Secrets the operator owns, and the account-key Secret a job names (read by name).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, update, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create, list, watch]
# The gang schedulers' PodGroups (runPolicy.scheduling.gang): created before the workers, their fields kept in
# line, deleted when the job ends or is suspended.
- apiGroups: [scheduling.x-k8s.io, scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [get, create, patch, delete]
# Kueue's MultiKueue (spec.managedBy kueue.x-k8s.io/multikueue): on the manager cluster, the dispatched job's
# Workload; on a worker, the Workload that admitted Kueue's copy of the job, marked Finished when it ends.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, create]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
{{- if .Values.networkPolicy.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch]
{{- end }}
{{- end -}}

{{/* The metrics Service; the Secret of its certificate (metrics.certSecret, or the one the chart makes) and the
ConfigMap of the CA the chart makes. */}}
{{- define "dtjob.metricsService" -}}
{{- printf "%s-metrics" (include "dtjob.fullname" .) -}}
{{- end -}}

{{- define "dtjob.metricsTlsSecret" -}}
{{- .Values.metrics.certSecret | default (printf "%s-metrics-tls" (include "dtjob.fullname" .)) -}}
{{- end -}}

{{- define "dtjob.metricsCaConfigMap" -}}
{{- printf "%s-metrics-ca" (include "dtjob.fullname" .) -}}
{{- end -}}

{{/* How a scraper verifies the secure /metrics server (a prometheus-operator SafeTLSConfig, as YAML): the CA
the chart made (the ConfigMap), or with metrics.certSecret that Secret's ca.crt (cert-manager writes one), and
the Service's name the certificate carries. Each key of metrics.serviceMonitor.tlsConfig replaces the chart's
(`ca` whole); the installer alone may set insecureSkipVerify. */}}
{{- define "dtjob.metricsTlsConfig" -}}
{{- $tls := dict "serverName" (printf "%s.%s.svc" (include "dtjob.metricsService" .) .Release.Namespace) -}}
{{- if .Values.metrics.certSecret -}}
{{- $_ := set $tls "ca" (dict "secret" (dict "name" .Values.metrics.certSecret "key" "ca.crt")) -}}
{{- else -}}
{{- $_ := set $tls "ca" (dict "configMap" (dict "name" (include "dtjob.metricsCaConfigMap" .) "key" "ca.crt")) -}}
{{- end -}}
{{- range $key, $value := .Values.metrics.serviceMonitor.tlsConfig -}}
{{- $_ := set $tls $key $value -}}
{{- end -}}
{{- toYaml $tls -}}
{{- end -}}

{{/* The NFS shares jobs may mount cluster-wide, comma-separated, as the operator reads DTJOB_NFS_SHARES: an
empty list is none, a missing one any ("*"). */}}
{{- define "dtjob.nfsShares" -}}
{{- $policy := .Values.storagePolicy | default dict -}}
{{- join "," (ternary $policy.nfsShares (list "*") (hasKey $policy "nfsShares")) -}}
{{- end -}}

{{/* CEL: the request's namespace enforces the baseline or restricted Pod Security level (its label), for the
policy that admits jobs only there and for the operator guard that makes their pods only there. */}}
{{- define "dtjob.enforcesPodSecurity" -}}
has(namespaceObject.metadata.labels) && 'pod-security.kubernetes.io/enforce' in namespaceObject.metadata.labels && namespaceObject.metadata.labels['pod-security.kubernetes.io/enforce'] in ['baseline', 'restricted']
{{- end -}}
