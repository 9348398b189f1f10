"""The datasets shipped with nbattn: the CSV files of this folder (see README.md).

Read them with ``nbattn.datasets.load_csv(name)``.
"""
