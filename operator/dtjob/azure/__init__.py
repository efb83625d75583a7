"""Everything that talks to Azure: SAS minting, Blob transfers, AKS node pools.

The Azure SDKs are imported by the modules that need them, never here, so `import dtjob.azure` stays cheap.
"""
