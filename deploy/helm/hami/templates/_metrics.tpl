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
