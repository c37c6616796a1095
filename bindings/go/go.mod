module github.com/aggbox/aggbox/bindings/go

go 1.24
