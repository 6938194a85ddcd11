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

RUN useradd --create-home --uid 10001 trainyard \
    && mkdir -p /data /recipes \
    && chown trainyard:trainyard /data

WORKDIR /app
# Dependencies first, so code changes do not reinstall torch.
COPY pyproject.toml README.md ./
RUN mkdir service workers \
    && touch service/__init__.py workers/__init__.py \
    && pip install . \
    && pip uninstall --yes trainyard
COPY alembic.ini ./
COPY migrations ./migrations
COPY service ./service
COPY workers ./workers
# Editable: `trainyard migrate` finds migrations/ beside the packages.
RUN pip install --no-deps -e .

USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["sh", "-c", "trainyard migrate && exec trainyard serve"]
