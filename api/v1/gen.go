// Package apiv1 holds the lanekit agent's gRPC API, generated from
// lanekit.proto (the service), the files of its messages by concept and
// observe.proto, with the protoc plugins pinned as tools in go.mod.
package apiv1

//go:generate sh -c "protoc -I . --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --plugin=protoc-gen-go-grpc=$(go tool -n protoc-gen-go-grpc) --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative lanekit.proto endpoint.proto attach.proto cni.proto status.proto vm.proto objects.proto services.proto policies.proto dpu.proto"
//go:generate sh -c "protoc -I . --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --plugin=protoc-gen-go-grpc=$(go tool -n protoc-gen-go-grpc) --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative observe.proto"
