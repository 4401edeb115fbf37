package main

const sysMemfdCreate = 279

func memfd() (int, error) { return memfdCreate(sysMemfdCreate) }
