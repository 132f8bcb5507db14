{{/* Names, labels and the table of roles. */}}

{{- define "pdserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "pdserve.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "pdserve.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The roles: values key, component name (label, resource names), the module the image runs, whether it
runs the model (prefill/decode: advertise, GPU) and whether it reads the model files.
*/}}
{{- define "pdserve.roles" -}}
gateway: {key: gateway, component: gateway, module: services.gateway, engine: false, model: true}
prefill: {key: prefill, component: prefill, module: services.prefill_node, engine: true, model: true}
decode: {key: decode, component: decode, module: services.decode_node, engine: true, model: true}
cacheStore: {key: cacheStore, component: cache-store, module: services.cache_store, engine: false, model: false}
{{- end -}}

{{/* One role's table entry: include "pdserve.role" (list $ "prefill") | fromYaml */}}
{{- define "pdserve.role" -}}
{{- $roles := include "pdserve.roles" (index . 0) | fromYaml -}}
{{- index $roles (index . 1) | toYaml -}}
{{- end -}}

{{/* <fullname>-<component>; ctx: (list $ $role) */}}
{{- define "pdserve.componentName" -}}
{{- printf "%s-%s" (include "pdserve.fullname" (index . 0)) (index . 1).component -}}
{{- end -}}

{{- define "pdserve.headlessName" -}}
{{- printf "%s-headless" (include "pdserve.componentName" .) -}}
{{- end -}}

{{/* Fully qualified DNS name of a role's headless service; ctx: (list $ $role) */}}
{{- define "pdserve.headlessHost" -}}
{{- $root := index . 0 -}}
{{- printf "%s.%s.svc.%s" (include "pdserve.headlessName" .) $root.Release.Namespace $root.Values.clusterDomain -}}
{{- end -}}

{{- define "pdserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" (index . 0) }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ (index . 1).component }}
{{- end -}}

{{/* Kubernetes recommended labels; ctx: (list $ $role) */}}
{{- define "pdserve.labels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ include "pdserve.chart" $root }}
{{ include "pdserve.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: pdserve
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
{{- end -}}

{{- define "pdserve.commonLabels" -}}
helm.sh/chart: {{ include "pdserve.chart" . }}
app.kubernetes.io/name: {{ include "pdserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: pdserve
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "pdserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pdserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* host:port of cache-store pod 0 (what prefill and decode nodes talk to); "" when there is none. */}}
{{- define "pdserve.cacheStoreAddress" -}}
{{- $role := include "pdserve.role" (list . "cacheStore") | fromYaml -}}
{{- if and .Values.cacheStore.enabled (gt (int .Values.cacheStore.replicas) 0) -}}
{{- printf "%s-0.%s:%d" (include "pdserve.componentName" (list . $role)) (include "pdserve.headlessHost" (list . $role)) (int .Values.ports.grpc) -}}
{{- end -}}
{{- end -}}

{{/* The Secret (ca.crt, tls.crt, tls.key) of a role's internal mTLS certificate; ctx: (list $ $role) */}}
{{- define "pdserve.mtlsSecret" -}}
{{- $root := index . 0 -}}
{{- $name := index (default (dict) $root.Values.tls.internal.secretNames) (index . 1).key -}}
{{- default (printf "%s-mtls" (include "pdserve.componentName" .)) $name -}}
{{- end -}}
