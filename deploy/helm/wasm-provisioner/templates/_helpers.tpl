{{/* The release's full name: names every object of the release. */}}
{{- define "wasm-provisioner.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "wasm-provisioner.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "wasm-provisioner.selectorLabels" -}}
app.kubernetes.io/name: {{ include "wasm-provisioner.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The selector labels as a label selector. */}}
{{- define "wasm-provisioner.selector" -}}
{{- $pairs := list -}}
{{- range $key, $value := include "wasm-provisioner.selectorLabels" . | fromYaml -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* Node-local mode's node instances (the DaemonSet's pods): a name of their own, so
the Deployment's selector (selectorLabels, unchanged from deployment mode) never selects
them and theirs never selects the Deployment's pods. */}}
{{- define "wasm-provisioner.nodeSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-node" (include "wasm-provisioner.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The node instances' selector labels as a label selector (--instance-selector). */}}
{{- define "wasm-provisioner.nodeSelector" -}}
{{- $pairs := list -}}
{{- range $key, $value := include "wasm-provisioner.nodeSelectorLabels" . | fromYaml -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* The leader Lease's name, as the host makes it: the provisioner name with '/'
replaced by '-'. */}}
{{- define "wasm-provisioner.leaseName" -}}
{{- .Values.provisionerName | replace "/" "-" -}}
{{- end -}}

{{- define "wasm-provisioner.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "wasm-provisioner.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "wasm-provisioner.serviceAccountName" -}}
{{- default (include "wasm-provisioner.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Node-local mode's node instances' own ServiceAccount. */}}
{{- define "wasm-provisioner.nodeServiceAccountName" -}}
{{- default (printf "%s-node" (include "wasm-provisioner.fullname" .)) .Values.nodeLocal.serviceAccount.name -}}
{{- end -}}

{{/* The grants file's text: the grants value, else files/grants.yaml
(deploy/grants/grants.yaml). With modules.source=oci, each module of modules.oci gets its
`source: { oci: REF }` (an entry of its own when the grants have none for it) and
`registries` becomes the file's top-level `registries`. */}}
{{- define "wasm-provisioner.grants" -}}
{{- $text := "" -}}
{{- if .Values.grants -}}
{{- $text = toYaml .Values.grants -}}
{{- else -}}
{{- $text = .Files.Get "files/grants.yaml" -}}
{{- end -}}
{{- if eq .Values.modules.source "oci" -}}
{{- $grants := fromYaml $text -}}
{{- $modules := $grants.modules | default dict -}}
{{- range $name, $reference := .Values.modules.oci -}}
{{- $entry := get $modules $name | default dict -}}
{{- $source := dict "oci" $reference -}}
{{- with $.Values.modules.signatures -}}
{{- $_ := set $source "signatures" . -}}
{{- end -}}
{{- $_ := set $entry "source" $source -}}
{{- $_ := set $modules $name $entry -}}
{{- end -}}
{{- $_ := set $grants "modules" $modules -}}
{{- with .Values.registries -}}
{{- $_ := set $grants "registries" . -}}
{{- end -}}
{{- toYaml $grants -}}
{{- else -}}
{{- $text -}}
{{- end -}}
{{- end -}}

{{/* REGISTRY/REPOSITORY (REPOSITORY alone without a registry). */}}
{{- define "wasm-provisioner.imageName" -}}
{{- if .Values.image.registry -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.image.registry) .Values.image.repository -}}
{{- else -}}
{{- .Values.image.repository -}}
{{- end -}}
{{- end -}}

{{- define "wasm-provisioner.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" (include "wasm-provisioner.imageName" .) .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" (include "wasm-provisioner.imageName" .) (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
