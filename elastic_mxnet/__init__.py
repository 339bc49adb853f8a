"""elastic_mxnet"""
