// Package hooks holds KubeVirt's hook sidecar gRPC API (Info and Callbacks
// v1alpha3), generated from protos that mirror KubeVirt's wire format, with
// the protoc plugins pinned as tools in go.mod.
package hooks

//go:generate sh -c "protoc -I . --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --plugin=protoc-gen-go-grpc=$(go tool -n protoc-gen-go-grpc) --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative info/api_info.proto v1alpha3/api_v1alpha3.proto"
