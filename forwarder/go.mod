module pycni/forwarder

go 1.19
