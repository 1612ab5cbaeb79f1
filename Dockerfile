FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY brainstem ./brainstem
COPY prompts_seed ./prompts_seed
COPY tools_seed ./tools_seed
RUN pip install --no-cache-dir .
RUN useradd --create-home agent
USER agent
CMD ["brainstem", "--help"]
