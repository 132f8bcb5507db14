{{/*
Where the model files come from in the gateway, prefill and decode pods (model.source=path): the volume
`model` (model.volume, or an emptyDir when model.init fills it), mounted read-only at model.mountPath, and
optionally the init container `model-init` that copies the files into it before the service starts (from
an image that holds them, or from a PVC). Nothing is downloaded at run time.
*/}}

{{/* The `model` volume's source as YAML, or nothing when the role's pods have none; ctx: (list $ $role) */}}
{{- define "pdserve.modelVolume" -}}
{{- $model := (index . 0).Values.model -}}
{{- if and (index . 1).model (eq $model.source "path") -}}
{{- if $model.volume -}}
{{- toYaml $model.volume -}}
{{- else if $model.init.enabled -}}
emptyDir: {sizeLimit: {{ $model.init.sizeLimit }}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the role's pods run the model-init container ("true" or nothing); ctx: (list $ $role) */}}
{{- define "pdserve.modelInitEnabled" -}}
{{- $model := (index . 0).Values.model -}}
{{- if and (index . 1).model $model.init.enabled -}}
{{- if ne $model.source "path" -}}
{{- fail "model.init.enabled needs model.source=path (the files it copies are served from model.path)" -}}
{{- end -}}
{{- if not (or $model.init.image $model.init.fromClaim) -}}
{{- fail "model.init.enabled needs model.init.image (an image holding the files at fromPath) or model.init.fromClaim (a PVC)" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* The init container that copies the model into the `model` volume; ctx: (list $ $role) */}}
{{- define "pdserve.modelInitContainer" -}}
{{- $root := index . 0 -}}
{{- $model := $root.Values.model -}}
{{- $init := $model.init -}}
- name: model-init
  image: {{ default (include "pdserve.image" $root) $init.image | quote }}
  imagePullPolicy: {{ default $root.Values.image.pullPolicy $init.pullPolicy }}
  # A volume that already holds a finished copy (a PVC, a node-local hostPath) is not copied again.
  command:
    - sh
    - -c
    - |
      set -eu
      if [ -e "$MODEL_DEST/.pdserve-model-copied" ]; then echo "model already in $MODEL_DEST"; exit 0; fi
      echo "copying the model from $MODEL_SOURCE to $MODEL_DEST"
      cp -Rf "$MODEL_SOURCE"/. "$MODEL_DEST"/
      touch "$MODEL_DEST/.pdserve-model-copied"
  env:
    - {name: MODEL_SOURCE, value: {{ $init.fromPath | quote }}}
    - {name: MODEL_DEST, value: {{ $model.mountPath | quote }}}
  resources:
    {{- toYaml (default (dict) $init.resources) | nindent 4 }}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  volumeMounts:
    - {name: model, mountPath: {{ $model.mountPath | quote }}}
    {{- if $init.fromClaim }}
    - name: model-source
      mountPath: {{ $init.fromPath | quote }}
      readOnly: true
      {{- with $init.claimSubPath }}
      subPath: {{ . | quote }}
      {{- end }}
    {{- end }}
{{- end -}}
