{{/*
Autoscaling helpers. A role scales when its autoscaling.hpa.enabled (a HorizontalPodAutoscaler on
prometheus-adapter's Pods/External metrics) or autoscaling.keda.enabled (a KEDA ScaledObject with
prometheus triggers), never both. Targets of 0 are not used. The series are selected by the labels a
ServiceMonitor (podTargetLabels) or a labelmap of pod labels puts on them.
*/}}

{{/* "hpa", "keda" or "" for a role; fails on a configuration no scaler can run. ctx: (list $ $role) */}}
{{- define "pdserve.scaler" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- $scaling := (index $root.Values $role.key).autoscaling -}}
{{- if $scaling -}}
{{- if and $scaling.hpa.enabled $scaling.keda.enabled -}}
{{- fail (printf "%s.autoscaling: hpa.enabled and keda.enabled are both true; they are mutually exclusive (a KEDA ScaledObject runs its own HPA): turn one off" $role.key) -}}
{{- end -}}
{{- if or $scaling.hpa.enabled $scaling.keda.enabled -}}
{{- if lt (int $scaling.maxReplicas) (int $scaling.minReplicas) -}}
{{- fail (printf "%s.autoscaling: maxReplicas (%d) is below minReplicas (%d)" $role.key (int $scaling.maxReplicas) (int $scaling.minReplicas)) -}}
{{- end -}}
{{- $used := 0 -}}
{{- range $name, $target := $scaling.targets }}{{ if gt (float64 $target) 0.0 }}{{ $used = add1 $used }}{{ end }}{{ end -}}
{{- if eq $used 0 -}}
{{- fail (printf "%s.autoscaling: no target is set (every one is 0): set at least one of %s" $role.key (keys $scaling.targets | sortAlpha | join ", ")) -}}
{{- end -}}
{{- if $scaling.hpa.enabled }}hpa{{ else }}keda{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* PromQL label matchers of one role's series in this release; ctx: (list $ component) */}}
{{- define "pdserve.promSelector" -}}
{{- $root := index . 0 -}}
{{- printf "namespace=%q,app_kubernetes_io_instance=%q,app_kubernetes_io_component=%q" $root.Release.Namespace $root.Release.Name (index . 1) -}}
{{- end -}}

{{/* The name prometheus-adapter gives the TTFT quantile (an External metric), e.g. pdserve_request_ttft_seconds_p90 */}}
{{- define "pdserve.ttftMetric" -}}
{{- printf "pdserve_request_ttft_seconds_p%d" (round (mulf .Values.autoscaling.ttftQuantile 100) 0 | int) -}}
{{- end -}}

{{/* A number as a Kubernetes quantity: whole numbers as they are, others in thousandths (0.85 → 850m) */}}
{{- define "pdserve.quantity" -}}
{{- $number := float64 . -}}
{{- if eq (floor $number) $number }}{{ int64 $number }}{{ else }}{{ printf "%dm" (round (mulf $number 1000) 0 | int) }}{{ end -}}
{{- end -}}

{{/*
The metrics a role scales on, one entry each: {target, value, pods | external | cpu} where pods and
external name the metric prometheus-adapter serves. ctx: (list $ $role)
*/}}
{{- define "pdserve.scalingMetrics" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- $targets := (index $root.Values $role.key).autoscaling.targets -}}
{{- $metrics := list -}}
{{- $pods := dict "requestsWaiting" "pdserve_requests_waiting" "requestsInFlight" "pdserve_requests_in_flight" "kvUsage" "pdserve_kv_usage_ratio" -}}
{{- range $name := keys $targets | sortAlpha -}}
{{- $value := float64 (index $targets $name) -}}
{{- if gt $value 0.0 -}}
{{- if hasKey $pods $name -}}
{{- $metrics = append $metrics (dict "target" $name "value" $value "pods" (index $pods $name)) -}}
{{- else if eq $name "ttftSeconds" -}}
{{- $metrics = append $metrics (dict "target" $name "value" $value "external" (include "pdserve.ttftMetric" $root)) -}}
{{- else if eq $name "cpuUtilization" -}}
{{- $metrics = append $metrics (dict "target" $name "value" $value "cpu" true) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "metrics" $metrics) -}}
{{- end -}}

{{/* The PromQL a KEDA trigger runs for a target; ctx: (list $ $role $target) */}}
{{- define "pdserve.kedaQuery" -}}
{{- $root := index . 0 -}}
{{- $sel := include "pdserve.promSelector" (list $root (index . 1).component) -}}
{{- $target := index . 2 -}}
{{- if eq $target "requestsWaiting" -}}
{{- printf "sum(pdserve_requests_waiting{%s})" $sel -}}
{{- else if eq $target "requestsInFlight" -}}
{{- printf "sum(pdserve_requests_in_flight{%s})" $sel -}}
{{- else if eq $target "kvUsage" -}}
{{- printf "avg(sum by (pod) (pdserve_kv_blocks{state=~\"held|reserved\",%s}) / sum by (pod) (pdserve_kv_capacity_blocks{%s}))" $sel $sel -}}
{{- else if eq $target "ttftSeconds" -}}
{{- $gateways := include "pdserve.promSelector" (list $root "gateway") -}}
{{- printf "histogram_quantile(%v, sum by (le) (rate(pdserve_request_ttft_seconds_bucket{%s}[%s])))" $root.Values.autoscaling.ttftQuantile $gateways $root.Values.autoscaling.ttftWindow -}}
{{- end -}}
{{- end -}}
