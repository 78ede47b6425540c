"""The Kubernetes backend: a run's environments rendered as manifests (see docs/kubernetes.md).

`plan.mission_manifests` builds the specs `corral run` would start and
`render.render_manifests` turns them into Pods, the broker's Deployment and
Service, and NetworkPolicies, as plain dicts; `yaml_out` serialises them.
`backend.KubernetesConfig` is the backend config variant: it renders, and
its backend refuses to start without a cluster (applying is not part of
this build).
"""
