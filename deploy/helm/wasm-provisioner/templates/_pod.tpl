{{- /*
The host's pod template, one definition for every workload the chart renders. Called
with (dict "root" $ "role" ROLE), ROLE one of:
- deployment: deployment mode's Deployment;
- controller: node-local mode's Deployment, that pod plus --mode=node-local
  --node-local-role=controller, the channel's address and port, the pod's IP, the
  selector of the node instances and the node-gone policy;
- node: node-local mode's DaemonSet, that pod without the leader-election flags (an
  instance never elects), plus --mode=node-local --node-local-role=node, the channel's
  address and port and the projected token it enrols with; its own labels,
  ServiceAccount and nodeLocal.instances' scheduling and resources.
*/ -}}
{{- define "wasm-provisioner.podTemplate" -}}
{{- $ := .root -}}
{{- $role := .role -}}
{{- $node := eq $role "node" -}}
{{- $controller := eq $role "controller" -}}
{{- $fullname := include "wasm-provisioner.fullname" $ -}}
{{- $source := $.Values.modules.source -}}
{{- $instances := $.Values.nodeLocal.instances -}}
metadata:
  labels:
    {{- if $node }}
    {{- include "wasm-provisioner.nodeSelectorLabels" $ | nindent 4 }}
    {{- else }}
    {{- include "wasm-provisioner.selectorLabels" $ | nindent 4 }}
    {{- end }}
    {{- with $.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # The host reads its grants at start: a change rolls the pods.
    checksum/grants: {{ include "wasm-provisioner.grants" $ | sha256sum }}
    {{- with $.Values.signatureKeys }}
    # And the signature keys: a change rolls the pods too.
    checksum/signature-keys: {{ toJson . | sha256sum }}
    {{- end }}
    {{- with $.Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- if $node }}
  serviceAccountName: {{ include "wasm-provisioner.nodeServiceAccountName" $ }}
  {{- else }}
  serviceAccountName: {{ include "wasm-provisioner.serviceAccountName" $ }}
  {{- end }}
  {{- with $.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (ternary $instances.priorityClassName $.Values.priorityClassName $node) }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml $.Values.podSecurityContext | nindent 4 }}
  {{- if eq $source "initContainer" }}
  initContainers:
    - name: modules
      image: {{ $.Values.modules.initContainer.image }}
      command:
        {{- if $.Values.modules.initContainer.command }}
        {{- toYaml $.Values.modules.initContainer.command | nindent 8 }}
        {{- else }}
        - cp
        - -R
        - {{ printf "%s/." (trimSuffix "/" $.Values.modules.initContainer.path) }}
        - /etc/wasm-provisioner/modules/
        {{- end }}
      securityContext:
        {{- toYaml $.Values.securityContext | nindent 8 }}
      volumeMounts:
        - { name: modules, mountPath: /etc/wasm-provisioner/modules }
  {{- end }}
  containers:
    - name: wasm-provisioner
      image: {{ include "wasm-provisioner.image" $ }}
      imagePullPolicy: {{ $.Values.image.pullPolicy }}
      securityContext:
        {{- toYaml $.Values.securityContext | nindent 8 }}
      args:
        - run
        - --provisioner-name={{ $.Values.provisionerName }}
        - --modules=/etc/wasm-provisioner/modules
        - --grants=/etc/wasm-provisioner/grants/grants.yaml
        # A subdirectory the host creates mode 0700: the emptyDir itself is mode 0777,
        # and the host refuses a cache directory others can write.
        - --cache-dir=/var/cache/wasm-provisioner/cwasm
        - --metrics-address=0.0.0.0:{{ $.Values.metricsPort }}
        - --log={{ $.Values.log.level }}
        - --log-format={{ $.Values.log.format }}
        - --threads={{ $.Values.threads }}
        {{- if not $node }}
        - --leader-elect={{ $.Values.leaderElection.enabled }}
        {{- if $.Values.leaderElection.enabled }}
        - --leader-election-lease-duration={{ $.Values.leaderElection.leaseDuration }}
        - --leader-election-renew-deadline={{ $.Values.leaderElection.renewDeadline }}
        - --leader-election-retry-period={{ $.Values.leaderElection.retryPeriod }}
        {{- end }}
        {{- end }}
        {{- if $controller }}
        - --mode=node-local
        # Elects and leads, serves no node: every guest call for a node goes to that
        # node's instance (the DaemonSet); calls for no node run here.
        - --node-local-role=controller
        # The channel (the node-calls port below): the instances enrol on it.
        - --node-address=0.0.0.0:{{ $.Values.nodeLocal.port }}
        # The leader finds each node's instance among the pods this selects: the
        # DaemonSet's, which the Deployment's selector does not select.
        - --instance-selector={{ include "wasm-provisioner.nodeSelector" $ }}
        - --node-gone-policy={{ $.Values.nodeLocal.nodeGonePolicy }}
        - --node-gone-grace={{ $.Values.nodeLocal.nodeGoneGrace }}
        {{- end }}
        {{- if $node }}
        - --mode=node-local
        # Serves its node, never elects, writes nothing; follows the Lease (read-only)
        # to enrol with the leader.
        - --node-local-role=node
        # The channel (the node-calls port below).
        - --node-address=0.0.0.0:{{ $.Values.nodeLocal.port }}
        {{- end }}
        {{- range $.Values.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        # The node this pod runs on: guests that make volumes on their own node
        # refuse a volume for another one.
        - name: WASM_PROVISIONER_NODE_NAME
          valueFrom: { fieldRef: { fieldPath: spec.nodeName } }
        {{- if $controller }}
        # Advertised on the Lease by the leader, with the channel's port, for the
        # instances to enrol.
        - name: WASM_PROVISIONER_POD_IP
          valueFrom: { fieldRef: { fieldPath: status.podIP } }
        {{- end }}
        {{- with $.Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - { name: metrics, containerPort: {{ $.Values.metricsPort }} }
        {{- if or $controller $node }}
        - { name: node-calls, containerPort: {{ $.Values.nodeLocal.port }} }
        {{- end }}
      livenessProbe:
        httpGet: { path: /healthz, port: metrics }
      readinessProbe:
        httpGet: { path: /readyz, port: metrics }
      {{- with (ternary $instances.resources $.Values.resources $node) }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: modules
          mountPath: /etc/wasm-provisioner/modules
          readOnly: true
          {{- if and (eq $source "image") $.Values.modules.image.subPath }}
          subPath: {{ $.Values.modules.image.subPath }}
          {{- end }}
        - { name: grants, mountPath: /etc/wasm-provisioner/grants, readOnly: true }
        - { name: cache, mountPath: /var/cache/wasm-provisioner }
        {{- if $.Values.dataDir.enabled }}
        - { name: data, mountPath: {{ $.Values.dataDir.path }} }
        {{- end }}
        {{- if $node }}
        # --token-file's default: /var/run/secrets/wasm-provisioner/token.
        - { name: token, mountPath: /var/run/secrets/wasm-provisioner, readOnly: true }
        {{- end }}
        {{- if $.Values.signatureKeys }}
        - { name: signature-keys, mountPath: /etc/wasm-provisioner/keys, readOnly: true }
        {{- end }}
        {{- with $.Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: modules
      {{- if eq $source "files" }}
      configMap: { name: {{ $fullname }}-modules }
      {{- else if eq $source "configMap" }}
      configMap: { name: {{ $.Values.modules.configMap.name }} }
      {{- else if eq $source "volume" }}
      {{- toYaml $.Values.modules.volume | nindent 6 }}
      {{- else if eq $source "image" }}
      image:
        reference: {{ $.Values.modules.image.reference }}
        pullPolicy: {{ $.Values.modules.image.pullPolicy }}
      {{- else }}
      emptyDir: {}
      {{- end }}
    - name: grants
      configMap: { name: {{ $fullname }}-grants }
    - name: cache
      emptyDir: {}
    {{- if $.Values.dataDir.enabled }}
    - name: data
      hostPath: { path: {{ $.Values.dataDir.path }}, type: {{ $.Values.dataDir.type }} }
    {{- end }}
    {{- if $node }}
    - name: token
      # A token bound to this pod, for the controller only (audience
      # wasm-provisioner): the leader's TokenReview proves which pod, and so which
      # node, enrols. kubelet renews it before it expires.
      projected:
        sources:
          - serviceAccountToken:
              audience: wasm-provisioner
              expirationSeconds: 3600
              path: token
    {{- end }}
    {{- if $.Values.signatureKeys }}
    - name: signature-keys
      configMap: { name: {{ $fullname }}-keys }
    {{- end }}
    {{- with $.Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with (ternary $instances.nodeSelector $.Values.nodeSelector $node) }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (ternary $instances.tolerations $.Values.tolerations $node) }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (ternary $instances.affinity $.Values.affinity $node) }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if and (not $node) $.Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- range $.Values.topologySpreadConstraints }}
    {{- $constraint := deepCopy . }}
    {{- if not $constraint.labelSelector }}
    {{- $_ := set $constraint "labelSelector" (dict "matchLabels" (include "wasm-provisioner.selectorLabels" $ | fromYaml)) }}
    {{- end }}
    - {{ toYaml $constraint | nindent 6 | trim }}
    {{- end }}
  {{- end }}
{{- end -}}
