# Trainyard on a GPU box. torch==2.13.0 from PyPI is the CUDA build on linux/x86_64 and
# brings its CUDA runtime, cuDNN and NCCL as wheels; the host supplies only the NVIDIA
# driver, through the NVIDIA Container Toolkit (see docker-compose.yml).
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRAINYARD_DATA_DIR=/data \
    TRAINYARD_DATABASE_URL=sqlite:////data/trainyard.db \
    TRAINYARD_RECIPES_DIR=/recipes

# trainyard runs the API; the worker starts as root only to run each job as trainyard-job
# (docker-compose.yml), which can read nothing of the API's or the worker's.
RUN useradd --create-home --uid 10001 trainyard \
    && useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
       --uid 10002 trainyard-job \
    && mkdir -p /data /recipes \
    && chown trainyard:trainyard /data

WORKDIR /app
# Dependencies first, so code changes do not reinstall torch. A box behind a mirror or a
# proxy passes its pip config for the build only, as a secret (it may hold credentials,
# and a secret is in no layer):  docker build --secret id=pip.conf,src=./pip.conf .
COPY pyproject.toml README.md ./
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    mkdir service workers trainyard \
    && touch service/__init__.py workers/__init__.py trainyard/__init__.py \
    && pip install . \
    && pip uninstall --yes trainyard
COPY alembic.ini ./
COPY migrations ./migrations
COPY service ./service
COPY workers ./workers
COPY trainyard ./trainyard
# Editable: `trainyard migrate` finds migrations/ beside the packages.
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    pip install --no-deps -e .

USER 10001
EXPOSE 8000
# The port the server listens on: 8000 unless TRAINYARD_PORT says (host networking).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TRAINYARD_PORT', '8000'), timeout=4)"]
CMD ["sh", "-c", "trainyard migrate && exec trainyard serve"]
