"""The staging program run by the staging Job and by rank 0's results step: `python -m dtjob.stager`.

    python -m dtjob.stager [download] --container-url-file F --sas-file F --prefix P --dest DIR ...
    python -m dtjob.stager upload --container-url-file F --sas-file F --prefix P --src DIR ...

Credentials come only from files of the mounted SAS Secret (re-read as they rotate), never from argv or env.
An upload is the results upload (dtjob.contract.results_upload): one line per try naming this pod, retries
for --retry-for seconds, and the run's manifest written last once every file is up.
"""
