{{/* Secure metrics (metrics.secure.enabled): the rules with which a component asks the
API server who a scraper is (TokenReview) and whether it may get /metrics
(SubjectAccessReview). Both are "create" of a review object that is never stored. */}}
{{- define "hami.metricsReviewRules" -}}
# Secure metrics: who is scraping (TokenReview) and may they get /metrics
# (SubjectAccessReview); reviews are answered, never stored.
- apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
{{- end -}}

{{- define "hami.metricsReader" -}}
{{- printf "%s-metrics-reader" (include "hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Secure metrics with the ServiceMonitors: the account whose token they present. */}}
{{- define "hami.metricsScraper" -}}
{{- printf "%s-metrics-scraper" (include "hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret (release namespace) holding the token the ServiceMonitors present:
prometheus.scrapeToken.secretName, or the chart's <release>-metrics-scraper-token. */}}
{{- define "hami.metricsScraper.tokenSecret" -}}
{{- $token := .Values.prometheus.scrapeToken | default dict -}}
{{- if $token.secretName -}}
{{- $token.secretName -}}
{{- else -}}
{{- printf "%s-metrics-scraper-token" (include "hami.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The endpoint fields that make Prometheus present that token: prometheus-operator's
`authorization` (type Bearer, credentials from the Secret); `bearerTokenFile` is
deprecated there, and refused where the operator denies file system access. */}}
{{- define "hami.metricsScraper.authorization" -}}
{{- $token := .Values.prometheus.scrapeToken | default dict -}}
authorization:
  type: Bearer
  credentials:
    name: {{ include "hami.metricsScraper.tokenSecret" . }}
    key: {{ $token.key | default "token" }}
{{- end -}}
