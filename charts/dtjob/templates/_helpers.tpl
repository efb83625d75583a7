{{- define "dtjob.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dtjob.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dtjob.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
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
# kopf watches jobs; the operator reads one to reconcile it and deletes it after ttlSecondsAfterFinished.
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
# going?) and, for the Service, ConfigMap and NetworkPolicy, a patch of the fields the operator owns.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch]
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
  verbs: [create]
{{- if .Values.networkPolicy.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch]
{{- end }}
{{- end -}}
