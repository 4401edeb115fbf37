package main

const sysMemfdCreate = 319

func memfd() (int, error) { return memfdCreate(sysMemfdCreate) }
