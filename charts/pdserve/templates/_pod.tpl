{{/*
The pod template every role uses; ctx: (list $ $role). The image's entrypoint is `python -m` and the
container's only argument is the role's module; every setting arrives as PDSERVE_* env (ConfigMap via
envFrom, plus the pod-specific ones below, which win over the ConfigMap).
*/}}
{{- define "pdserve.podTemplate" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- $values := index $root.Values $role.key -}}
{{- $settings := include "pdserve.settings" . | fromYaml -}}
{{- $ports := $root.Values.ports -}}
{{- $modelVolume := include "pdserve.modelVolume" . -}}
{{- $modelInit := include "pdserve.modelInitEnabled" . -}}
{{- $mtls := $root.Values.tls.internal.enabled -}}
{{- $publicTLS := and (eq $role.key "gateway") $root.Values.gateway.tls.secretName -}}
metadata:
  labels:
    {{- include "pdserve.labels" . | nindent 4 }}
    {{- with merge (deepCopy (default (dict) $values.podLabels)) (default (dict) $root.Values.podLabels) }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ toJson $settings | sha256sum }}
    {{- if $root.Values.metricsAnnotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $ports.metrics | int | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with merge (deepCopy (default (dict) $values.podAnnotations)) (default (dict) $root.Values.podAnnotations) }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "pdserve.serviceAccountName" $root }}
  automountServiceAccountToken: false
  enableServiceLinks: false  # Service env vars would be named PDSERVE_*_PORT and the like
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  terminationGracePeriodSeconds: {{ include "pdserve.terminationSeconds" . }}
  {{- if $modelInit }}
  initContainers:
    {{- include "pdserve.modelInitContainer" . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ $role.component }}
      image: {{ include "pdserve.image" $root | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      args: [{{ $role.module | quote }}]
      envFrom:
        - configMapRef:
            name: {{ include "pdserve.componentName" . }}
      env:
        {{- include "pdserve.env" . | nindent 8 }}
        {{- with concat (default (list) $root.Values.extraEnv) (default (list) $values.extraEnv) }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - {name: grpc, containerPort: {{ $ports.grpc | int }}, protocol: TCP}
        - {name: health, containerPort: {{ $ports.health | int }}, protocol: TCP}
        - {name: metrics, containerPort: {{ $ports.metrics | int }}, protocol: TCP}
        {{- if and (eq $role.key "gateway") $mtls }}
        - {name: admin, containerPort: {{ $ports.admin | int }}, protocol: TCP}
        {{- end }}
        {{- if and (eq $role.key "gateway") $values.service.http.enabled }}
        - {name: http, containerPort: {{ $values.service.http.port | int }}, protocol: TCP}
        {{- end }}
      # grpc.health.v1.Health on the plaintext health port (a probe presents no certificate; the gRPC
      # port is mTLS): NOT_SERVING while draining (and engine nodes bind only once the model is loaded,
      # hence the startup probe). Liveness tolerates a whole drain.
      startupProbe:
        grpc: {port: {{ $ports.health | int }}}
        periodSeconds: {{ $values.startupProbe.periodSeconds | int }}
        failureThreshold: {{ $values.startupProbe.failureThreshold | int }}
        timeoutSeconds: 3
      readinessProbe:
        grpc: {port: {{ $ports.health | int }}}
        periodSeconds: 5
        timeoutSeconds: 3
        failureThreshold: 2
      livenessProbe:
        grpc: {port: {{ $ports.health | int }}}
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: {{ include "pdserve.livenessFailures" . }}
      lifecycle:
        preStop:  # endpoints and the gateway's DNS drop the pod before SIGTERM starts the drain
          exec:
            command: ["sleep", {{ $values.preStopSleepSeconds | int | quote }}]
      resources:
        {{- include "pdserve.resources" (list $values $role) | nindent 8 }}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      volumeMounts:
        - {name: tmp, mountPath: /tmp}
        {{- if $modelVolume }}
        - {name: model, mountPath: {{ $root.Values.model.mountPath | quote }}, readOnly: true}
        {{- end }}
        {{- if and (eq $role.key "cacheStore") $values.disk.enabled }}
        - {name: kv-disk, mountPath: {{ $values.disk.mountPath | quote }}}
        {{- end }}
        {{- if and (eq $role.key "gateway") $values.apiKeySecret.name }}
        - {name: api-keys, mountPath: /etc/pdserve/api-keys, readOnly: true}  # no subPath: updates reach it
        {{- end }}
        {{- if $mtls }}
        - {name: mtls, mountPath: /etc/pdserve/mtls, readOnly: true}  # no subPath: a renewed Secret reaches it
        {{- end }}
        {{- if $publicTLS }}
        - {name: public-tls, mountPath: /etc/pdserve/public-tls, readOnly: true}
        {{- end }}
        {{- with concat (default (list) $root.Values.extraVolumeMounts) (default (list) $values.extraVolumeMounts) }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {sizeLimit: {{ $root.Values.tmpSizeLimit }}}
    {{- if $modelVolume }}
    - name: model
      {{- $modelVolume | nindent 6 }}
    {{- end }}
    {{- if and $modelInit $root.Values.model.init.fromClaim }}
    - name: model-source
      persistentVolumeClaim: {claimName: {{ $root.Values.model.init.fromClaim | quote }}, readOnly: true}
    {{- end }}
    {{- if and (eq $role.key "gateway") $values.apiKeySecret.name }}
    - name: api-keys
      secret:
        secretName: {{ $values.apiKeySecret.name | quote }}
        items: [{key: {{ $values.apiKeySecret.key | quote }}, path: keys}]
    {{- end }}
    {{- if $mtls }}
    - name: mtls
      secret:
        secretName: {{ include "pdserve.mtlsSecret" . | quote }}
        items: [{key: ca.crt, path: ca.crt}, {key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}]
    {{- end }}
    {{- if $publicTLS }}
    - name: public-tls
      secret:
        secretName: {{ $root.Values.gateway.tls.secretName | quote }}
        items: [{key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}]
    {{- end }}
    {{- if and (eq $role.key "cacheStore") $values.disk.enabled (not $values.disk.persistence.enabled) }}
    - name: kv-disk
      emptyDir: {sizeLimit: {{ $values.disk.sizeLimit }}}
    {{- end }}
    {{- with concat (default (list) $root.Values.extraVolumes) (default (list) $values.extraVolumes) }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* Container env: the pod's identity, its listen addresses, tracing. ctx: (list $ $role) */}}
{{- define "pdserve.env" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- $ports := $root.Values.ports -}}
{{- $tracing := $root.Values.tracing -}}
- {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
- {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
- {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
- {name: PDSERVE_LISTEN, value: {{ printf "0.0.0.0:%d" ($ports.grpc | int) | quote }}}
- {name: PDSERVE_METRICS_LISTEN, value: {{ printf "0.0.0.0:%d" ($ports.metrics | int) | quote }}}
- {name: PDSERVE_ADVERTISE, value: {{ printf "$(POD_IP):%d" ($ports.grpc | int) | quote }}}
- {name: PDSERVE_HEALTH_LISTEN, value: {{ printf "0.0.0.0:%d" ($ports.health | int) | quote }}}
{{- if $root.Values.tls.internal.enabled }}
- {name: PDSERVE_MTLS_DIR, value: /etc/pdserve/mtls}
{{- if eq $role.key "gateway" }}
- {name: PDSERVE_ADMIN_LISTEN, value: {{ printf "0.0.0.0:%d" ($ports.admin | int) | quote }}}
{{- end }}
{{- else }}
- {name: PDSERVE_INSECURE, value: "true"}
{{- end }}
{{- if and (eq $role.key "gateway") $root.Values.gateway.tls.secretName }}
- {name: PDSERVE_TLS_CERT, value: /etc/pdserve/public-tls/tls.crt}
- {name: PDSERVE_TLS_KEY, value: /etc/pdserve/public-tls/tls.key}
{{- end }}
{{- if and (eq $role.key "gateway") $root.Values.gateway.apiKeySecret.name }}
- {name: PDSERVE_API_KEY_FILE, value: /etc/pdserve/api-keys/keys}
{{- end }}
{{- if and (eq $role.key "gateway") $root.Values.gateway.service.http.enabled }}
- {name: PDSERVE_HTTP_LISTEN, value: {{ printf "0.0.0.0:%d" ($root.Values.gateway.service.http.port | int) | quote }}}
{{- end }}
- {name: OTEL_TRACES_EXPORTER, value: {{ $tracing.exporter | quote }}}
{{- if ne $tracing.exporter "none" }}
- {name: OTEL_SERVICE_NAME, value: {{ printf "pdserve-%s" $role.component | quote }}}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "service.namespace=$(POD_NAMESPACE),service.instance.id=$(POD_NAME),k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"
- {name: OTEL_METRICS_EXPORTER, value: none}
- {name: OTEL_LOGS_EXPORTER, value: none}
- {name: OTEL_TRACES_SAMPLER, value: {{ $tracing.sampler | quote }}}
{{- with $tracing.samplerArg }}
- {name: OTEL_TRACES_SAMPLER_ARG, value: {{ . | toString | quote }}}
{{- end }}
{{- if $tracing.endpoint }}
- {name: OTEL_EXPORTER_OTLP_ENDPOINT, value: {{ $tracing.endpoint | quote }}}
- {name: OTEL_EXPORTER_OTLP_PROTOCOL, value: {{ $tracing.protocol | quote }}}
{{- end }}
{{- range $name, $value := $tracing.env }}
- {name: {{ $name }}, value: {{ include "pdserve.settingText" $value | quote }}}
{{- end }}
{{- end }}
{{- end -}}

{{/* The role's resources, with its GPUs (requests = limits, as extended resources need). ctx: (list $values $role) */}}
{{- define "pdserve.resources" -}}
{{- $values := index . 0 -}}
{{- $resources := deepCopy (default (dict) $values.resources) -}}
{{- if and (index . 1).engine (gt (int $values.gpu) 0) -}}
{{- $limits := default (dict) $resources.limits -}}
{{- $requests := default (dict) $resources.requests -}}
{{- $_ := set $limits $values.gpuResource (int $values.gpu) -}}
{{- $_ := set $requests $values.gpuResource (int $values.gpu) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- $_ := set $resources "requests" $requests -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end -}}
