module github.com/shoaldb/shoal/test/gosdk

go 1.26.8

require (
	github.com/cloudflare/cloudflare-go/v4 v4.6.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/tidwall/gjson v1.14.4 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
