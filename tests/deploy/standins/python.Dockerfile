# A stand-in for the official python:3.11-slim-bookworm, for machines that cannot pull it
# (scripts/image_check.sh tags it so for its build only): Debian's python3.11, arranged as
# the official image is: python, python3 and pip on PATH, ensurepip and venv, and pip
# installing as root without --break-system-packages (the official Python is not Debian's).
FROM trainyard-standin/debian:bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates netbase tzdata \
        python3 python3-pip python3-venv python-is-python3 \
    && rm -rf /var/lib/apt/lists/* /usr/lib/python3.11/EXTERNALLY-MANAGED \
    && ln -s /usr/bin/pip3 /usr/local/bin/pip
ENV LANG=C.UTF-8
CMD ["python3"]
