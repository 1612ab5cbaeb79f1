FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY brainstem ./brainstem
COPY prompts_seed ./prompts_seed
COPY tools_seed ./tools_seed
# Production reads the USDC balance on Base (WALLET_ADDRESS), so the image takes the wallet extra (web3);
# an image for agents with no wallet can install "." alone, without the Ethereum stack.
RUN pip install --no-cache-dir ".[wallet]"
RUN useradd --create-home agent
USER agent
CMD ["brainstem", "--help"]
