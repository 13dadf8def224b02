module github.com/keyshard/keyshard/clock

go 1.26.0
