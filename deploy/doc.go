// Package deploy holds lanekit's Kubernetes manifests (plain YAML, a
// kustomization), the KubeVirt binding registration and the container image
// builds; its test decodes every manifest strictly and checks that they
// agree with each other and with the agent.
package deploy
