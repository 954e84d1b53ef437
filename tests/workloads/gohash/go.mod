module gohash

go 1.19
