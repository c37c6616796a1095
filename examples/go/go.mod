module github.com/aggbox/aggbox/examples/go

go 1.24

require github.com/aggbox/aggbox/bindings/go v0.0.0

// In your own module, drop this line: go get github.com/aggbox/aggbox/bindings/go
replace github.com/aggbox/aggbox/bindings/go => ../../bindings/go
