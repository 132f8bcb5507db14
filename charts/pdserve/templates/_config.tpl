{{/*
A role's PDSERVE_* settings, as a YAML map of setting name → value; ctx: (list $ $role).
Precedence: the role's `config`, then the global `config`, then what the chart derives (node addresses,
the model path, served name, context length and deterministic mode, the disk tier). listen, metrics_listen and advertise are container env (they must match
the pod's ports), never settings here.
*/}}
{{- define "pdserve.settings" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- $values := index $root.Values $role.key -}}
{{- $derived := dict -}}
{{- $port := int $root.Values.ports.grpc -}}
{{- $store := include "pdserve.cacheStoreAddress" $root -}}
{{- if eq $role.key "gateway" -}}
{{- $roles := include "pdserve.roles" $root | fromYaml -}}
{{- $_ := set $derived "prefill" (printf "dns:///%s:%d" (include "pdserve.headlessHost" (list $root $roles.prefill)) $port) -}}
{{- $_ := set $derived "decode" (printf "dns:///%s:%d" (include "pdserve.headlessHost" (list $root $roles.decode)) $port) -}}
{{- if $store -}}
{{- $_ := set $derived "cache_store" (printf "dns:///%s:%d" (include "pdserve.headlessHost" (list $root $roles.cacheStore)) $port) -}}
{{- end -}}
{{- else if eq $role.key "prefill" -}}
{{- if $store }}{{ $_ := set $derived "cache_store" $store }}{{ end -}}
{{- else if eq $role.key "decode" -}}
{{- if $store }}{{ $_ := set $derived "offload_cache_store" $store }}{{ end -}}
{{- else if and (eq $role.key "cacheStore") $values.disk.enabled -}}
{{- $_ := set $derived "disk_dir" $values.disk.mountPath -}}
{{- end -}}
{{- if and $role.model (eq $root.Values.model.source "path") -}}
{{- $_ := set $derived "model" (include "pdserve.modelPath" $root) -}}
{{- end -}}
{{- if and $role.model $root.Values.model.maxModelLen -}}
{{- $_ := set $derived "max_model_len" (int $root.Values.model.maxModelLen) -}}
{{- end -}}
{{- if and $role.model $root.Values.model.deterministic -}}
{{- $_ := set $derived "deterministic" true -}}
{{- end -}}
{{- if and (eq $role.key "gateway") $root.Values.model.servedModelName -}}
{{- $_ := set $derived "served_model_name" $root.Values.model.servedModelName -}}
{{- end -}}
{{- $settings := merge (deepCopy (default (dict) $values.config)) (deepCopy (default (dict) $root.Values.config)) $derived -}}
{{- toYaml $settings -}}
{{- end -}}

{{/* The model file or directory inside the pod when model.source is path. */}}
{{- define "pdserve.modelPath" -}}
{{- $model := .Values.model -}}
{{- if not $model.path -}}
{{- fail "model.source=path needs model.path (a GGUF file or HF directory; relative = under model.mountPath)" -}}
{{- end -}}
{{- if isAbs $model.path -}}
{{- $model.path -}}
{{- else -}}
{{- printf "%s/%s" (trimSuffix "/" $model.mountPath) $model.path -}}
{{- end -}}
{{- end -}}

{{/* A setting's value as text: whole numbers without an exponent (YAML numbers arrive as float64). */}}
{{- define "pdserve.settingText" -}}
{{- if kindIs "float64" . -}}
{{- if eq (floor .) . }}{{ int64 . }}{{ else }}{{ . }}{{ end -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: preStop sleep + drain_timeout_s + grace_s + margin; ctx: (list $ $role) */}}
{{- define "pdserve.terminationSeconds" -}}
{{- $root := index . 0 -}}
{{- $settings := include "pdserve.settings" . | fromYaml -}}
{{- $values := index $root.Values (index . 1).key -}}
{{- $total := addf $values.preStopSleepSeconds (default 30.0 $settings.drain_timeout_s) (default 5.0 $settings.grace_s) $root.Values.terminationMarginSeconds -}}
{{- ceil $total | int -}}
{{- end -}}

{{/* Liveness failures to tolerate: a draining process reports NOT_SERVING for up to drain_timeout_s + grace_s. */}}
{{- define "pdserve.livenessFailures" -}}
{{- $settings := include "pdserve.settings" . | fromYaml -}}
{{- $drain := addf (default 30.0 $settings.drain_timeout_s) (default 5.0 $settings.grace_s) -}}
{{- max 3 (add1 (ceil (divf $drain 10) | int)) -}}
{{- end -}}
